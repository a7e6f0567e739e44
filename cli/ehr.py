"""`svc-auth ehr check --org ORG [--json]`: can svc-auth read this clinic's FHIR EHR?"""
from __future__ import annotations

import json

from cli.common import UsageError, existing, with_runtime
from models.directory import Organization, User


def register(commands) -> None:
    ehr = commands.add_parser("ehr", help="a clinic's EHR connection").add_subparsers(
        dest="action", metavar="ACTION", required=True)
    p = ehr.add_parser("check", help="try discovery, the token, one Practitioner and one Appointment search")
    p.add_argument("org_positional", nargs="?", metavar="ORG", help="organization id (or --org)")
    p.add_argument("--org", help="organization id (org_...)")
    p.add_argument("--json", action="store_true", help='print {"ok", "steps": [{"step", "ok", "detail"}]}')
    p.set_defaults(handler=with_runtime(_check))


def _check(runtime, args) -> int:
    from connectors import Bounds, connector_for
    org_id = args.org or args.org_positional
    if not org_id:
        raise UsageError("give the organization: svc-auth ehr check --org ORG")
    org = existing(Organization.get_or_none(Organization.id == org_id), "organization", org_id)
    if org.ehr != "fhir":
        raise UsageError(f"organization {org.id} is on the {org.ehr!r} EHR; ehr check tries FHIR EHRs (--ehr fhir)")
    physician = (User.select().where((User.organization == org.id) & User.npi.is_null(False) & (User.npi != ""))
                 .order_by(User.id).first())
    steps = connector_for(runtime, org, Bounds.check(runtime.settings)).check(physician.npi if physician else None, runtime.clock.now())
    ok = len(steps) == 4 and all(s["ok"] for s in steps)
    if args.json:
        print(json.dumps({"ok": ok, "steps": steps}))
    else:
        for s in steps:
            print(f"{s['step']}: {'ok' if s['ok'] else 'FAILED'}: {s['detail']}")
    return 0 if ok else 1
