"""`svc-auth keys rotate|list|rekey`."""
from __future__ import annotations

import datetime as dt

from cli.common import emit, with_runtime
from lifecycle.signing_keys import rotate_signing_key


def register(commands) -> None:
    keys = commands.add_parser("keys", help="signing keys").add_subparsers(dest="action", required=True)
    p = keys.add_parser("rotate", help="add a signing key: published at once, signing after "
                                       "SVC_KEY_PREPUBLISH_SECONDS; old keys stay published until their tokens expire")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=with_runtime(_rotate))
    p = keys.add_parser("list", help="published signing keys")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=with_runtime(_list))
    p = keys.add_parser("rekey", help="after a change of SVC_HMAC_KEY: re-seal what SVC_HMAC_KEY_PREVIOUS sealed "
                                      "under the new key, and report what still needs an old key")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=with_runtime(_rekey))


def _when(epoch: int) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _state(runtime) -> dict:
    ring = runtime.keyring
    return {"active_kid": ring.active.kid, "published": [k["kid"] for k in ring.jwks()["keys"]],
            "upcoming": [{"kid": k.kid, "signs_from": _when(k.not_before)} for k in ring.upcoming]}


def _rotate(runtime, args):
    key = rotate_signing_key(runtime)
    emit({"kid": key.kid, "signs_from": _when(key.not_before), **_state(runtime)}, args.json)


def _list(runtime, args):
    emit(_state(runtime), args.json)


def _rekey(runtime, args):
    from keys.rekey import rekey
    result = rekey(runtime)
    emit(result, args.json)
    if "refused" in result:
        import sys
        print(f"svc-auth keys rekey: refused ({result['refused']['cause']}): {result['refused']['reason']}",
              file=sys.stderr)
    return 1 if "audit_error" in result or "refused" in result else 0
