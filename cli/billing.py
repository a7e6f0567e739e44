"""`svc-auth billing report --month YYYY-MM [--format csv|json]`."""
from __future__ import annotations

import csv
import json
import sys

from cli.common import with_runtime
from lifecycle.billing import billing_report, report_rows


def register(commands) -> None:
    billing = commands.add_parser("billing", help="billing ledger").add_subparsers(dest="action", required=True)
    p = billing.add_parser("report", help="billable users per organization for a month")
    p.add_argument("--month", required=True, help="YYYY-MM (UTC)")
    p.add_argument("--app", help="only this application id")
    p.add_argument("--format", choices=["csv", "json"], default="json", help="output format (default json)")
    p.set_defaults(handler=with_runtime(_report))


def _report(runtime, args):
    report = billing_report(args.month, args.app)
    if args.format == "json":
        print(json.dumps(report))
    else:
        csv.writer(sys.stdout).writerows(report_rows(report))

