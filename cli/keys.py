"""`svc-auth keys rotate|list`."""
from __future__ import annotations

from cli import emit, with_runtime
from lifecycle.signing_keys import rotate_signing_key


def register(commands) -> None:
    keys = commands.add_parser("keys", help="signing keys").add_subparsers(dest="action", required=True)
    p = keys.add_parser("rotate", help="add a new active signing key; old keys stay published until their tokens expire")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=with_runtime(_rotate))
    p = keys.add_parser("list", help="published signing keys")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=with_runtime(_list))


def _rotate(runtime, args):
    key = rotate_signing_key(runtime)
    emit({"active_kid": key.kid, "published": [k["kid"] for k in runtime.keyring.jwks()["keys"]]}, args.json)


def _list(runtime, args):
    emit({"active_kid": runtime.keyring.active.kid,
          "published": [k["kid"] for k in runtime.keyring.jwks()["keys"]]}, args.json)
