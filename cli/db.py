"""`svc-auth db migrate`."""
from __future__ import annotations


def register(commands) -> None:
    db = commands.add_parser("db", help="database").add_subparsers(dest="action", required=True)
    p = db.add_parser("migrate", help="create tables and apply pending migrations")
    p.set_defaults(handler=_migrate)


def _migrate(settings, args):
    from runtime import Runtime
    runtime = Runtime(settings)
    done = runtime.migrate()
    print("\n".join(done) if done else "schema is up to date")
    runtime.close()
