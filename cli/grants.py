"""`svc-auth grants list|revoke`: SMART refresh-token grants (offline_access / online_access)."""
from __future__ import annotations

from cli.common import add_json_flag, emit, emit_list, with_runtime
from lifecycle.grants import end_grants
from oauth.smart_grants import grant_dict, list_grants


def register(commands) -> None:
    grants = commands.add_parser("grants", help="SMART refresh-token grants").add_subparsers(
        dest="action", metavar="ACTION", required=True)
    p = grants.add_parser("list", help="list live grants (not revoked, not expired), oldest first")
    p.add_argument("--app", metavar="APPLICATION_ID", help="only this application's")
    p.add_argument("--user", metavar="USER_ID", help="only this user's")
    p.add_argument("--org", metavar="ORG", help="only this clinic's")
    add_json_flag(p)
    p.set_defaults(handler=with_runtime(_list))
    p = grants.add_parser("revoke", help="end grants: their refresh tokens and live access tokens stop at once")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--grant", metavar="GRANT_ID", help="one grant")
    which.add_argument("--app", metavar="APPLICATION_ID", help="every grant of this application")
    which.add_argument("--user", metavar="USER_ID", help="every grant of this user")
    add_json_flag(p)
    p.set_defaults(handler=with_runtime(_revoke))


def _list(runtime, args):
    rows = [grant_dict(g) for g in list_grants(runtime, args.app, args.user, args.org)]
    emit_list(rows, args.json, ["grant_id", "application_id", "user_id", "organization_id", "access", "expires_at"])


def _revoke(runtime, args):
    emit({"revoked": end_grants(runtime, "operator", grant_id=args.grant, application_id=args.app,
                                user_id=args.user)}, args.json)
