"""`svc-auth developers invite`: a one-time link for a partner developer to the console."""
from __future__ import annotations

from cli.common import emit, with_runtime
from console.accounts import invite_developer
from models.clock import utc_iso


def register(commands) -> None:
    developers = commands.add_parser("developers", help="developer console accounts").add_subparsers(
        dest="action", required=True)
    p = developers.add_parser("invite", help="give a developer access to an application; prints a one-time link")
    p.add_argument("--app", required=True, help="application id")
    p.add_argument("--email", required=True, help="the developer's e-mail address (the console sign-in name)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=with_runtime(_invite))


def _invite(runtime, args):
    developer, url, expires_at = invite_developer(runtime, args.app, args.email)
    if args.json:
        emit({"invite_url": url, "developer_id": developer.id, "email": developer.email,
              "application_id": args.app, "expires_at": utc_iso(expires_at)}, True)
    else:
        print(url)
