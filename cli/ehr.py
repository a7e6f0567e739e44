"""`svc-auth ehr check --org ORG [--npi NPI]... [--json]`: can svc-auth read this clinic's FHIR EHR?
`svc-auth ehr jwks`: svc-auth's EHR client public keys, for an EHR that takes an uploaded key set.
`svc-auth ehr rotate-key [--finish] [--json]`: a new EHR client key (lifecycle.ehr_keys)."""
from __future__ import annotations

import json

from cli.common import UsageError, emit, existing, with_runtime
from models.directory import Organization, User
from models.npi import is_npi


def register(commands) -> None:
    ehr = commands.add_parser("ehr", help="a clinic's EHR connection").add_subparsers(
        dest="action", metavar="ACTION", required=True)
    p = ehr.add_parser("check", help="try discovery, the token, its scopes, the physicians' Practitioners and an "
                                       "Appointment search")
    p.add_argument("org_positional", nargs="?", metavar="ORG", help="organization id (or --org)")
    p.add_argument("--org", help="organization id (org_...)")
    p.add_argument("--npi", action="append", help="look up this NPI (repeatable) instead of every physician's")
    p.add_argument("--json", action="store_true", help='print {"ok", "steps": [{"step", "ok", "detail"}]}')
    p.set_defaults(handler=with_runtime(_check))
    p = ehr.add_parser("jwks", help="print svc-auth's EHR client public keys (JWKS), for EHRs that take an "
                                    "uploaded key set (Oracle Health's System Account Management)")
    p.set_defaults(handler=with_runtime(_jwks))
    p = ehr.add_parser("rotate-key", help="add an EHR client key that signs from now on; the previous keys stay in "
                                          "/ehr/jwks.json for SVC_EHR_KEY_OVERLAP_SECONDS, then are deleted")
    p.add_argument("--finish", action="store_true", help="end the overlap now: delete every key but the newest "
                                                         "(after a leak, or once every EHR has the new key)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=with_runtime(_rotate_key))


def _check(runtime, args) -> int:
    from connectors import Bounds, connector_for
    org_id = args.org or args.org_positional
    if not org_id:
        raise UsageError("give the organization: svc-auth ehr check --org ORG")
    org = existing(Organization.get_or_none(Organization.id == org_id), "organization", org_id)
    if org.ehr != "fhir":
        raise UsageError(f"organization {org.id} is on the {org.ehr!r} EHR; ehr check tries FHIR EHRs (--ehr fhir)")
    if args.npi:
        bad = [n for n in args.npi if not is_npi(n)]
        if bad:
            raise UsageError(f"--npi must be a 10-digit NPI, got {bad[0][:40]!r}")
        npis = args.npi
    else:  # every physician of the clinic, in a stable order
        npis = [u.npi for u in User.select(User.npi).where(
            (User.organization == org.id) & User.npi.is_null(False) & (User.npi != "")).order_by(User.npi, User.id)]
    steps = connector_for(runtime, org, Bounds.check(runtime.settings)).check(npis, runtime.clock.now())
    if len(steps) > 2 and steps[2]["ok"]:  # the scopes are known: the clinic's CapabilityStatement anew
        from connectors import ConnectorError
        from fhir_api.clinic_capability import refresh
        try:
            refresh(runtime, org, Bounds.check(runtime.settings))
        except ConnectorError as exc:
            steps.append({"step": "capabilities", "ok": False, "detail": f"the EHR's CapabilityStatement: {exc}"})
    ok = bool(steps) and steps[-1]["step"] == "appointments" and all(s["ok"] for s in steps)
    if args.json:
        print(json.dumps({"ok": ok, "steps": steps}))
    else:
        for s in steps:
            said = f" (the EHR wrote: {s['ehr_said']})" if s.get("ehr_said") else ""
            print(f"{s['step']}: {'ok' if s['ok'] else 'FAILED'}: {s['detail']}{said}")
    return 0 if ok else 1


def _jwks(runtime, args) -> int:
    """The same document as `GET {SVC_ISSUER}/ehr/jwks.json`: public halves only."""
    print(json.dumps(runtime.ehr_keys.jwks(), indent=1))
    return 0


def _rotate_key(runtime, args) -> int:
    from lifecycle.ehr_keys import finish_ehr_key_rotation, rotate_ehr_key
    emit(finish_ehr_key_rotation(runtime) if args.finish else rotate_ehr_key(runtime), args.json)
    return 0
