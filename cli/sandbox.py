"""`svc-auth sandbox token|signin-link`: sandbox EHR access for operators (only with SVC_SANDBOX=on)."""
from __future__ import annotations

from cli.common import UsageError, emit, with_runtime
from hub.sandbox import create_signin_link, issue_sandbox_token, require_sandbox_user
from models.directory import User
from errors import ApiError


def register(commands) -> None:
    sandbox = commands.add_parser("sandbox", help="sandbox EHR (a testing tool; needs SVC_SANDBOX=on)").add_subparsers(
        dest="action", required=True)
    p = sandbox.add_parser("token", help="print a sandbox access token for a user of a sandbox clinic")
    p.add_argument("--user", required=True, help="user id (usr_...) of a sandbox organization")
    p.set_defaults(handler=with_runtime(_token))
    p = sandbox.add_parser("signin-link", help="print a one-time sign-in URL that opens the user's sandbox hub")
    p.add_argument("--user", required=True, help="user id (a user of a sandbox clinic)")
    p.add_argument("--app", help="application id: the hub opens this app at once (deep link)")
    p.add_argument("--json", action="store_true", help='print {"url"}')
    p.set_defaults(handler=with_runtime(_signin_link))


def _require_on(runtime) -> None:
    if not runtime.settings.sandbox:
        raise UsageError("the sandbox EHR is off; set SVC_SANDBOX=on to use it (it is a testing tool)")


def _token(runtime, args):
    _require_on(runtime)
    try:
        user = require_sandbox_user(User.get_or_none(User.id == args.user), args.user)
        print(issue_sandbox_token(runtime, user))
    except ApiError as exc:
        raise UsageError(exc.message) from None


def _signin_link(runtime, args):
    _require_on(runtime)
    try:
        url = create_signin_link(runtime, args.user, args.app)
    except ApiError as exc:
        raise UsageError(exc.message) from None
    if args.json:
        emit({"url": url}, True)
    else:
        print(url)
