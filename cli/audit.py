"""`svc-auth audit list` (configuration changes), `audit disclosures` (an accounting of disclosures),
`audit verify` (the disclosure chain) and `audit prune` (retention). See docs/audit.md."""
from __future__ import annotations

import datetime as dt
import json
import sys

from cli.common import add_json_flag, UsageError, emit, existing, with_runtime
from models.audit import AuditEvent
from models.clock import utc_iso

ACTOR = "operator"


def register(commands) -> None:
    audit = commands.add_parser("audit", help="audit trails: configuration changes and disclosures of patient data")
    actions = audit.add_subparsers(dest="action", required=True)
    p = actions.add_parser("list", help="recent configuration changes, newest first")
    p.add_argument("--limit", type=int, default=50, help="at most this many events (default 50)")
    p.add_argument("--action", dest="audit_action", help="only this action, e.g. keys.rotated")
    p.add_argument("--subject", help="only events about this subject (an application, an organization...)")
    p.add_argument("--from", dest="start", help="only events at or after this time (ISO 8601)")
    add_json_flag(p)
    p.set_defaults(handler=with_runtime(_list))

    p = actions.add_parser("disclosures", help="the accounting of disclosures of one clinic, oldest first")
    p.add_argument("--org", required=True, help="the clinic (organization id)")
    p.add_argument("--patient", help="only records naming this patient id")
    p.add_argument("--app", help="only this application id")
    p.add_argument("--user", help="only this user id")
    p.add_argument("--from", dest="start", help="ISO 8601 (UTC unless an offset is given), inclusive")
    p.add_argument("--to", dest="end", help="ISO 8601, exclusive")
    p.add_argument("--format", choices=["json", "csv", "fhir"], default=None,
                   help="json (as --json), csv, or fhir (a Bundle of IHE BALP AuditEvents)")
    p.add_argument("--json", action="store_true", help="print a JSON array")
    p.set_defaults(handler=with_runtime(_disclosures))

    p = actions.add_parser("verify", help="verify the disclosure chain (HMAC links, seq, an earlier head)")
    p.add_argument("--head", help="a head printed by an earlier verify: fails if the chain no longer contains it")
    add_json_flag(p)
    p.set_defaults(handler=with_runtime(_verify))

    p = actions.add_parser("prune", help="delete disclosure records older than the retention (recorded)")
    p.add_argument("--before", help="ISO 8601; at most now minus SVC_DISCLOSURE_RETENTION_DAYS (the default)")
    add_json_flag(p)
    p.set_defaults(handler=with_runtime(_prune))


def _list(runtime, args):
    if not 0 < args.limit <= 10000:
        raise UsageError("--limit must be between 1 and 10000")
    query = AuditEvent.select().order_by(AuditEvent.at.desc(), AuditEvent.id.desc()).limit(args.limit)
    if args.audit_action:
        query = query.where(AuditEvent.action == args.audit_action)
    if args.subject:
        query = query.where(AuditEvent.subject == args.subject)
    if args.start:
        query = query.where(AuditEvent.at >= parse_time("--from", args.start))
    events = [{"at": utc_iso(e.at), "actor": e.actor, "action": e.action, "subject": e.subject, "detail": e.detail}
              for e in query]
    if args.json:
        emit({"events": events}, True)
    else:
        for e in events:
            print(f"{e['at']}  {e['actor']:<24} {e['action']:<40} {e['subject']}  {json.dumps(e['detail'])}")


def parse_time(name: str, value: str | None) -> dt.datetime | None:
    """ISO 8601 (a date, or a date and time; `Z` or an offset, else UTC) -> naive UTC."""
    if value is None:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
        if parsed.tzinfo is not None:  # 9999-12-31T23:00-10:00 lies past year 9999 in UTC: OverflowError
            parsed = parsed.astimezone(dt.timezone.utc).replace(tzinfo=None)
    except (ValueError, OverflowError):
        raise UsageError(f"{name} must be an ISO 8601 date or time between the years 1 and 9999 in UTC, e.g. "
                         f"2026-01-31T00:00:00Z, got {value[:80]!r}") from None
    return parsed


def _disclosures(runtime, args):
    from audit.accounting import as_csv, as_fhir_bundle, read_accounting
    from models.directory import Organization
    output = args.format or "json"
    if len(args.org) > Organization.id.max_length:  # no clinic's id: its audit.read record would not fit
        existing(None, "organization", args.org[:80])
    start, end = parse_time("--from", args.start), parse_time("--to", args.end)
    filters = {"patient": args.patient, "app": args.app, "user": args.user, "from": args.start, "to": args.end}
    records = read_accounting(ACTOR, filters, output, organization_id=args.org, patient=args.patient,
                              application_id=args.app, user_id=args.user, start=start, end=end)
    if output == "csv":
        sys.stdout.write(as_csv(records))
    elif output == "fhir":
        print(json.dumps(as_fhir_bundle(records, runtime.settings.issuer)))
    elif args.json or args.format == "json":
        print(json.dumps(records))
    else:
        for r in records:
            print(f"{r['seq']:>8}  {r['at']}  {r['action']:<14} {r['outcome']:<7} {r['status'] or '':<4} "
                  f"app={r['application_id']} user={r['user_id']} patients={','.join(r['patients'])}")


def _verify(runtime, args):
    from audit.chain import is_mac, verify
    from audit.disclosures import chain_keys
    if args.head is not None and not is_mac(args.head):
        raise UsageError("--head must be the 64 hex digits of a head an earlier audit verify printed")
    result = verify(chain_keys(runtime), args.head, runtime.db)
    emit(result, args.json)
    return 0 if result["ok"] else 1


def _prune(runtime, args):
    from audit.chain import iso_ms, prune
    from audit.disclosures import chain_key
    latest = runtime.clock.now() - dt.timedelta(days=runtime.settings.disclosure_retention_days)
    before = parse_time("--before", args.before) or latest
    if before > latest:
        raise UsageError(f"--before {iso_ms(before)} is within the retention of {runtime.settings.disclosure_retention_days} "
                         f"days (SVC_DISCLOSURE_RETENTION_DAYS): at most {iso_ms(latest)}")
    from keys.holders import require_open_key
    require_open_key(runtime)  # a shell at step 1 after a rekey: its checkpoint would link under the closed key
    result = prune(runtime.db, chain_key(runtime), before, runtime.clock.now, {"actor": ACTOR})
    AuditEvent.record(ACTOR, "audit.prune", "disclosure_record", before=iso_ms(before), **result)
    emit({"before": iso_ms(before), **result}, args.json)
