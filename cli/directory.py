"""`svc-auth orgs|users|installs create|list|show|update`."""
from __future__ import annotations

from cli.common import UsageError, add_json_flag, emit, emit_list, existing, with_runtime
from cli.hl7 import add_feed_flags, apply_feed_flags, feed_flags_given
from lifecycle.activation import set_activation_status
from lifecycle.applications import install_application
from connectors.fhir.profiles import PROFILE_NAMES, SCOPE_CHOICES, parse_search_params
from connectors.fhir.epic_schedule import PROVIDER_ID_TYPES
from lifecycle.organizations import (EPIC_FIELDS, FHIR_AUTH_MODES, create_organization, search_params_of,
                                     update_organization)
from lifecycle.users import create_user, update_user
from models.application import ACTIVATION_STATUSES, Installation
from models.clock import utc_iso
from models.directory import Organization, User
from models.timezones import check_time_zone
from hl7feed.config import feed_dict


def register(commands) -> None:
    orgs = commands.add_parser("orgs", help="organizations (clinics)").add_subparsers(
        dest="action", metavar="ACTION", required=True)
    p = orgs.add_parser("create", help="create an organization")
    p.add_argument("--name", required=True, help="the clinic's name, as users see it")
    p.add_argument("--ehr", default="sandbox", help="the clinic's EHR connector: 'sandbox' (default) or 'fhir'")
    p.add_argument("--ehr-url", default="", help="base URL of the clinic's EHR (sent to apps as ehr_url)")
    add_fhir_flags(p)
    add_time_zone_flag(p)
    add_epic_flags(p)
    add_feed_flags(p)
    add_json_flag(p)
    p.set_defaults(handler=with_runtime(_create_org))
    p = orgs.add_parser("list", help="list every organization")
    add_json_flag(p)
    p.set_defaults(handler=with_runtime(_list_orgs))
    p = orgs.add_parser("show", help="show one organization with its users and installed apps")
    p.add_argument("--org", required=True, help="organization id (org_...)")
    add_json_flag(p)
    p.set_defaults(handler=with_runtime(_show_org))
    p = orgs.add_parser("update", help="change an organization's name, EHR or EHR URL")
    p.add_argument("--org", required=True, help="organization id (org_...)")
    p.add_argument("--name", help="new name")
    p.add_argument("--ehr", help="new EHR connector: 'sandbox' or 'fhir'")
    p.add_argument("--ehr-url", help="new EHR base URL ('' clears it)")
    add_fhir_flags(p)
    add_time_zone_flag(p)
    add_epic_flags(p)
    add_feed_flags(p)
    add_json_flag(p)
    p.set_defaults(handler=with_runtime(_update_org))

    users = commands.add_parser("users", help="users of an organization").add_subparsers(
        dest="action", metavar="ACTION", required=True)
    p = users.add_parser("create", help="create a user")
    p.add_argument("--org", required=True, help="organization id the user belongs to")
    p.add_argument("--email", required=True, help="e-mail address (unique across the platform)")
    p.add_argument("--given-name", help="given (first) name")
    p.add_argument("--family-name", help="family (last) name")
    p.add_argument("--ehr-username", help="the user's username in the clinic's EHR")
    p.add_argument("--npi", help="10-digit National Provider Identifier (physicians only)")
    add_json_flag(p)
    p.set_defaults(handler=with_runtime(_create_user))
    p = users.add_parser("list", help="list the users of an organization")
    p.add_argument("--org", required=True, help="organization id")
    add_json_flag(p)
    p.set_defaults(handler=with_runtime(_list_users))
    p = users.add_parser("show", help="show one user")
    p.add_argument("--user", required=True, help="user id (usr_...)")
    add_json_flag(p)
    p.set_defaults(handler=with_runtime(_show_user))
    p = users.add_parser("update", help="change a user's e-mail, names, EHR username or NPI")
    p.add_argument("--user", required=True, help="user id (usr_...)")
    p.add_argument("--email", help="new e-mail address")
    p.add_argument("--given-name", help="new given name ('' clears it)")
    p.add_argument("--family-name", help="new family name ('' clears it)")
    p.add_argument("--ehr-username", help="new EHR username ('' clears it)")
    p.add_argument("--npi", help="new 10-digit NPI ('' clears it)")
    add_json_flag(p)
    p.set_defaults(handler=with_runtime(_update_user))

    installs = commands.add_parser("installs", help="install apps in organizations").add_subparsers(
        dest="action", metavar="ACTION", required=True)
    p = installs.add_parser("create", help="install an application in an organization")
    p.add_argument("--app", required=True, help="application id (app_...)")
    p.add_argument("--org", required=True, help="organization id (org_...)")
    add_json_flag(p)
    p.set_defaults(handler=with_runtime(_install))
    p = installs.add_parser("list", help="list installations, optionally of one application")
    p.add_argument("--app", help="only this application id")
    add_json_flag(p)
    p.set_defaults(handler=with_runtime(_list_installs))
    p = installs.add_parser("update", help="set an installation's activation status (as the app would)")
    p.add_argument("--app", required=True, help="application id")
    p.add_argument("--org", required=True, help="organization id")
    p.add_argument("--status", required=True, choices=ACTIVATION_STATUSES,
                   help="Enabled or Disabled; allowed after the app's first SDK initialization there")
    add_json_flag(p)
    p.set_defaults(handler=with_runtime(_update_install))


def add_fhir_flags(p) -> None:
    """`--ehr fhir`: the clinic's FHIR R4 base URL and svc-auth's registration at that EHR."""
    p.add_argument("--fhir-base-url", help="the FHIR R4 base URL of the clinic's EHR (stored as its EHR URL)")
    p.add_argument("--fhir-client-id", help="svc-auth's client id at that EHR (SMART Backend Services)")
    p.add_argument("--fhir-auth", choices=FHIR_AUTH_MODES,
                   help="smart-backend (default), or none for an open test server only")
    p.add_argument("--fhir-profile", choices=PROFILE_NAMES,
                   help="the EHR's vendor rules: generic (default), epic, oracle or athena (docs/ehr-fhir.md)")
    p.add_argument("--fhir-scopes", choices=SCOPE_CHOICES,
                   help="SMART scope syntax asked of the EHR: auto (default: from its smart-configuration), v1 or v2")
    p.add_argument("--fhir-search-param", action="append", metavar="NAME=VALUE",
                   help="appended to every search of the EHR (repeatable), e.g. athena's "
                        "ah-practice=Organization/a-1.Practice-195900; on update, replaces the list")
    p.add_argument("--clear-fhir-search-params", action="store_true", help="remove every extra search parameter")


def add_time_zone_flag(p) -> None:
    p.add_argument("--time-zone", metavar="IANA",
                   help="the clinic's time zone (IANA name, e.g. America/Chicago; default UTC): the zone of "
                        "times an HL7 feed or Epic's web service sends without an offset")


def add_epic_flags(p) -> None:
    """`--fhir-profile epic`: Epic's GetProviderAppointments web service for the night (docs/ehr-fhir.md)."""
    p.add_argument("--epic-user-id", metavar="ID",
                   help="the Epic user svc-auth calls GetProviderAppointments as (with --fhir-profile epic): the "
                        "night then reads each physician's appointments from that web service ('' clears it)")
    p.add_argument("--epic-user-id-type", metavar="TYPE", help="the type of that user id (default External)")
    p.add_argument("--epic-provider-id-type", choices=PROVIDER_ID_TYPES,
                   help="how a physician is named to the web service: External (default: the Practitioner's "
                        "identifier whose type.text is EXTERNAL, or of --epic-provider-id-system) or NPI")
    p.add_argument("--epic-provider-id-system", metavar="URI",
                   help="the system of the Practitioner identifier sent as the External provider id ('' clears it)")
    p.add_argument("--epic-patient-id-system", metavar="URI",
                   help="the system of the Patient identifier holding Epic's Internal patient id, to find the FHIR "
                        "Patient of an appointment ('' clears it)")


def org_dict(org: Organization) -> dict:
    return {"id": org.id, "name": org.name, "ehr": org.ehr, "ehr_url": org.ehr_url,
            "fhir_client_id": org.fhir_client_id or None, "fhir_auth": org.fhir_auth if org.ehr == "fhir" else None,
            "fhir_profile": org.fhir_profile if org.ehr == "fhir" else None,
            "fhir_scopes": org.fhir_scopes if org.ehr == "fhir" else None,
            "fhir_search_params": [f"{n}={v}" for n, v in search_params_of(org)] if org.ehr == "fhir" else None,
            "time_zone": org.time_zone, **epic_dict(org), **feed_dict(org), "created_at": utc_iso(org.created_at)}


def epic_dict(org: Organization) -> dict:
    """The Epic web service's settings (None unless the clinic is on `fhir` with the epic profile)."""
    on_epic = org.ehr == "fhir" and org.fhir_profile == "epic"
    return {name: (getattr(org, name) or None) if on_epic else None for name in EPIC_FIELDS}


def user_dict(user: User) -> dict:
    return {"id": user.id, "organization_id": user.organization_id, "email": user.email,
            "given_name": user.given_name, "family_name": user.family_name,
            "ehr_username": user.ehr_username, "npi": user.npi}


def install_dict(inst: Installation) -> dict:
    return {"application_id": inst.application_id, "organization_id": inst.organization_id,
            "installed_at": utc_iso(inst.installed_at), "activation_status": inst.activation_status,
            "trial_started_at": utc_iso(inst.trial_started_at)}


def _org(org_id: str) -> Organization:
    return existing(Organization.get_or_none(Organization.id == org_id), "organization", org_id)


def _fhir_fields(args) -> dict:
    fields = {"ehr_url": args.fhir_base_url, "fhir_client_id": args.fhir_client_id, "fhir_auth": args.fhir_auth,
              "fhir_profile": args.fhir_profile, "fhir_scopes": args.fhir_scopes}
    if args.fhir_base_url is not None and args.ehr_url and args.ehr_url != args.fhir_base_url:
        raise UsageError("give the FHIR base URL once: --fhir-base-url or --ehr-url")
    if args.fhir_search_param is not None:
        try:
            fields["fhir_search_params"] = parse_search_params(args.fhir_search_param)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    elif args.clear_fhir_search_params:
        fields["fhir_search_params"] = ()
    return {name: value for name, value in fields.items() if value is not None}


def _checked_time_zone(args) -> dict:
    """`--time-zone` checked here (exit 2 naming the flag), as `{"time_zone": name}` when given."""
    if args.time_zone is None:
        return {}
    try:
        return {"time_zone": check_time_zone(args.time_zone)}
    except ValueError as exc:
        raise UsageError(f"--time-zone: {exc}") from None


def _epic_fields(args) -> dict:
    return {name: getattr(args, name) for name in EPIC_FIELDS if getattr(args, name) is not None}


def _create_org(runtime, args):
    fields = {**_fhir_fields(args), **_checked_time_zone(args), **_epic_fields(args)}
    with runtime.db.atomic():  # the clinic and its feed settings, or neither
        org = create_organization(args.name, args.ehr, fields.pop("ehr_url", args.ehr_url), **fields)
        org = apply_feed_flags(org.id, args) or org
    emit({k: v for k, v in org_dict(org).items() if k != "created_at"}, args.json)


def _list_orgs(runtime, args):
    rows = [org_dict(o) for o in Organization.select().order_by(Organization.created_at, Organization.id)]
    emit_list(rows, args.json, ["id", "name", "ehr", "ehr_url"])


def _show_org(runtime, args):
    org = _org(args.org)
    result = org_dict(org)
    result["users"] = [u.id for u in User.select(User.id).where(User.organization == org.id).order_by(User.id)]
    result["installed_applications"] = [
        i.application_id for i in Installation.select().where(Installation.organization == org.id)]
    emit(result, args.json)


def _update_org(runtime, args):
    fields = {**_fhir_fields(args), **_checked_time_zone(args), **_epic_fields(args)}
    ehr_url = fields.pop("ehr_url", args.ehr_url)
    if args.name is None and args.ehr is None and ehr_url is None and not fields and not feed_flags_given(args):
        raise UsageError("nothing to change: give --name, --ehr, --ehr-url, --time-zone, a --fhir-* or an --epic-* "
                         "flag, --schedule-source or an --hl7-* flag")
    with runtime.db.atomic():
        org = _org(args.org)
        if args.name is not None or args.ehr is not None or ehr_url is not None or fields:
            org = update_organization(args.org, args.name, args.ehr, ehr_url, **fields)
        org = apply_feed_flags(org.id, args) or org
    emit(org_dict(org), args.json)


def _create_user(runtime, args):
    user = create_user(args.org, args.email, args.given_name, args.family_name, args.ehr_username, args.npi)
    emit(user_dict(user), args.json)


def _list_users(runtime, args):
    org = _org(args.org)
    rows = [user_dict(u) for u in User.select().where(User.organization == org.id).order_by(User.created_at, User.id)]
    emit_list(rows, args.json, ["id", "email", "given_name", "family_name", "npi"])


def _show_user(runtime, args):
    emit(user_dict(existing(User.get_or_none(User.id == args.user), "user", args.user)), args.json)


def _update_user(runtime, args):
    values = (args.email, args.given_name, args.family_name, args.ehr_username, args.npi)
    if all(v is None for v in values):
        raise UsageError("nothing to change: give --email, --given-name, --family-name, --ehr-username or --npi")
    emit(user_dict(update_user(args.user, *values)), args.json)


def _install(runtime, args):
    inst = install_application(args.app, args.org)
    emit(install_dict(inst), args.json)


def _list_installs(runtime, args):
    query = Installation.select().order_by(Installation.installed_at, Installation.id)
    if args.app:
        query = query.where(Installation.application == args.app)
    emit_list([install_dict(i) for i in query], args.json,
              ["application_id", "organization_id", "activation_status", "installed_at"])


def _update_install(runtime, args):
    inst = Installation.find(args.app, args.org)
    if inst is None:
        raise UsageError(f"application {args.app!r} is not installed in organization {args.org!r}")
    emit(install_dict(set_activation_status(runtime, inst, args.status, actor="operator")), args.json)
