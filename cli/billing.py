"""`svc-auth billing report --month YYYY-MM [--format csv|json]` and `svc-auth audit list`."""
from __future__ import annotations

import csv
import json
import sys

from cli.common import emit, with_runtime
from lifecycle.billing import billing_report, report_rows
from models.audit import AuditEvent
from models.clock import utc_iso


def register(commands) -> None:
    billing = commands.add_parser("billing", help="billing ledger").add_subparsers(dest="action", required=True)
    p = billing.add_parser("report", help="billable users per organization for a month")
    p.add_argument("--month", required=True, help="YYYY-MM (UTC)")
    p.add_argument("--app", help="only this application id")
    p.add_argument("--format", choices=["csv", "json"], default="json", help="output format (default json)")
    p.set_defaults(handler=with_runtime(_report))

    audit = commands.add_parser("audit", help="audit trail").add_subparsers(dest="action", required=True)
    p = audit.add_parser("list", help="recent state changes, newest first")
    p.add_argument("--limit", type=int, default=50, help="at most this many events (default 50)")
    p.add_argument("--action", dest="audit_action", help="only this action, e.g. keys.rotated")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=with_runtime(_audit))


def _report(runtime, args):
    report = billing_report(args.month, args.app)
    if args.format == "json":
        print(json.dumps(report))
    else:
        csv.writer(sys.stdout).writerows(report_rows(report))


def _audit(runtime, args):
    from cli.common import UsageError
    if not 0 < args.limit <= 10000:
        raise UsageError("--limit must be between 1 and 10000")
    query = AuditEvent.select().order_by(AuditEvent.at.desc(), AuditEvent.id.desc()).limit(args.limit)
    if args.audit_action:
        query = query.where(AuditEvent.action == args.audit_action)
    events = [{"at": utc_iso(e.at), "actor": e.actor, "action": e.action, "subject": e.subject, "detail": e.detail}
              for e in query]
    if args.json:
        emit({"events": events}, True)
    else:
        for e in events:
            print(f"{e['at']}  {e['actor']:<24} {e['action']:<40} {e['subject']}  {json.dumps(e['detail'])}")
