"""`svc-auth demo seed [--reset] [--json]`."""
from __future__ import annotations

from cli.common import emit, with_runtime
from lifecycle.demo import seed_demo


def register(commands) -> None:
    demo = commands.add_parser("demo", help="demo data").add_subparsers(dest="action", required=True)
    p = demo.add_parser("seed", help="create the demo clinic, users and example app (idempotent)")
    p.add_argument("--app-url", help="base URL of the example partner app (default: where it is registered, "
                                     "else http://127.0.0.1:8889)")
    p.add_argument("--reset", action="store_true",
                   help="first delete the demo clinic, users and app: back to the first-launch state")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=with_runtime(lambda runtime, args: emit(seed_demo(runtime, args.app_url, reset=args.reset), args.json)))
