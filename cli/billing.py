"""`svc-auth billing report --month YYYY-MM [--format csv|json]`."""
from __future__ import annotations

import csv
import json
import sys

from cli.common import UsageError, printable, with_runtime
from lifecycle.billing import billing_report, report_rows


def register(commands) -> None:
    billing = commands.add_parser("billing", help="billing ledger").add_subparsers(dest="action", required=True)
    p = billing.add_parser("report", help="billable users per organization for a month")
    p.add_argument("--month", required=True, help="YYYY-MM (UTC)")
    p.add_argument("--app", help="only this application id")
    p.add_argument("--format", choices=["csv", "json"], default="json", help="output format (default json)")
    p.set_defaults(handler=with_runtime(_report))


def _report(runtime, args):
    if args.app is not None:
        _known_application(args.app)
    report = billing_report(args.month, args.app)
    if args.format == "json":
        print(json.dumps(report))
    else:
        csv.writer(sys.stdout).writerows(report_rows(report))



def _known_application(application_id: str) -> None:
    """A usage error unless the id names an application, or one deleted since (its ledger is kept):
    a mistyped id is not an empty bill."""
    from models.application import Application
    from models.billing import BillableUse
    if not (Application.select().where(Application.id == application_id).exists()
            or BillableUse.select().where(BillableUse.application_id == application_id).exists()):
        raise UsageError(f"no application has id {printable(application_id)!r}, and no billed use names it")
