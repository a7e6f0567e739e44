"""`svc-auth sandbox token --user ID`: the sandbox settings-page token (30 minutes)."""
from __future__ import annotations

from cli import UsageError, with_runtime
from lifecycle.sandbox import issue_sandbox_token
from models.directory import User


def register(commands) -> None:
    sandbox = commands.add_parser("sandbox", help="sandbox EHR").add_subparsers(dest="action", required=True)
    p = sandbox.add_parser("token", help="print a sandbox access token for a user")
    p.add_argument("--user", required=True, help="user id (usr_...) of a sandbox organization")
    p.set_defaults(handler=with_runtime(_token))


def _token(runtime, args):
    user = User.get_or_none(User.id == args.user)
    if user is None:
        raise UsageError(f"no user has id {args.user!r}")
    print(issue_sandbox_token(runtime, user))
