"""`svc-auth orgs|users|installs create`."""
from __future__ import annotations

from cli import emit, with_runtime
from lifecycle.registry import create_organization, create_user, install_application
from models.clock import utc_iso


def register(commands) -> None:
    orgs = commands.add_parser("orgs", help="organizations (clinics)").add_subparsers(dest="action", required=True)
    p = orgs.add_parser("create", help="create an organization")
    p.add_argument("--name", required=True)
    p.add_argument("--ehr", default="sandbox")
    p.add_argument("--ehr-url", default="")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=with_runtime(_create_org))

    users = commands.add_parser("users", help="users of an organization").add_subparsers(dest="action", required=True)
    p = users.add_parser("create", help="create a user")
    p.add_argument("--org", required=True)
    p.add_argument("--email", required=True)
    p.add_argument("--given-name")
    p.add_argument("--family-name")
    p.add_argument("--ehr-username")
    p.add_argument("--npi")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=with_runtime(_create_user))

    installs = commands.add_parser("installs", help="install apps in organizations").add_subparsers(dest="action", required=True)
    p = installs.add_parser("create", help="install an application in an organization")
    p.add_argument("--app", required=True)
    p.add_argument("--org", required=True)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=with_runtime(_install))


def _create_org(runtime, args):
    org = create_organization(args.name, args.ehr, args.ehr_url)
    emit({"id": org.id, "name": org.name, "ehr": org.ehr, "ehr_url": org.ehr_url}, args.json)


def _create_user(runtime, args):
    user = create_user(args.org, args.email, args.given_name, args.family_name, args.ehr_username, args.npi)
    emit({"id": user.id, "organization_id": user.organization_id, "email": user.email,
          "given_name": user.given_name, "family_name": user.family_name,
          "ehr_username": user.ehr_username, "npi": user.npi}, args.json)


def _install(runtime, args):
    inst = install_application(args.app, args.org)
    emit({"application_id": inst.application_id, "organization_id": inst.organization_id,
          "installed_at": utc_iso(inst.installed_at), "activation_status": inst.activation_status}, args.json)
