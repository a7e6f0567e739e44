"""`svc-auth db migrate` and `svc-auth db status [--json]`.

"schema N" is the highest migration number applied to the database (`schema_version`); the code's
number is its highest migration (`models.schema.MIGRATIONS`). Status exits 0 when nothing is
pending, 3 when `db migrate` has work to do.
"""
from __future__ import annotations

import datetime as dt
import json

from cli.common import add_json_flag

PENDING_EXIT = 3  # `db status`: migrations are pending


def register(commands) -> None:
    db = commands.add_parser("db", help="database").add_subparsers(dest="action", required=True)
    p = db.add_parser("migrate", help="create tables and apply pending migrations (SQLite: writes a backup "
                                      "copy of the database file first and prints its path)")
    p.set_defaults(handler=_migrate)
    p = db.add_parser("status", help="the database's schema number, the code's, and what is pending "
                                     "(exit 0: up to date, 3: `svc-auth db migrate` has work to do)")
    add_json_flag(p)
    p.set_defaults(handler=_status)


def _open(settings):
    from models.db import open_database
    from models.schema import bind_models
    db = open_database(settings.database_url, max_connections=2)
    bind_models(db)
    return db


def sqlite_backup(db) -> str:
    """Copy the SQLite database beside itself with SQLite's online backup API (consistent while
    other processes write); returns the line `db migrate` prints (None for a database still empty).

    The copy is written as `<backup>.partial` and renamed when complete, so a run killed while it
    copies leaves no file named as a backup that is not one; the next run (under the migration
    lock, so no other is copying) deletes such leftovers."""
    import glob
    import os
    import sqlite3
    from models.schema import schema_number
    for leftover in glob.glob(glob.escape(db.database) + ".schema-*.bak.partial*"):
        os.remove(leftover)
    if not db.get_tables():
        return None
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = f"{db.database}.schema-{schema_number(db)}.{stamp}.bak"
    target = sqlite3.connect(path + ".partial")
    try:
        db.connection().backup(target)
    finally:
        target.close()
    os.replace(path + ".partial", path)
    return f"backup of the database before migrating: {path}"


def _migrate(settings, args):
    import peewee
    from models.schema import migrate
    from models.schema import MigrationError
    from ops.startup import StartupError
    db = _open(settings)
    try:
        backup = (lambda: sqlite_backup(db)) if isinstance(db, peewee.SqliteDatabase) and db.database != ":memory:" else None
        done = migrate(db, before_change=backup)
    except MigrationError as exc:
        raise StartupError(str(exc)) from None
    finally:
        db.close()
    print("\n".join(done) if done else "schema is up to date", flush=True)


def status(db) -> dict:
    """{"schema": N, "code": N, "pending": [{"migration": N, "description": ...} | {"table": name}]}"""
    from models.schema import code_schema_number, pending_steps, schema_number
    return {"schema": schema_number(db), "code": code_schema_number(), "pending": pending_steps(db)}


def _status(settings, args):
    db = _open(settings)
    try:
        result = status(db)
    finally:
        db.close()
    if args.json:
        print(json.dumps(result))
    elif result["pending"]:
        print(f"schema {result['schema']}, code {result['code']}: {len(result['pending'])} pending; "
              "run `svc-auth db migrate`")
    else:
        print(f"schema {result['schema']}, code {result['code']}: up to date")
    return PENDING_EXIT if result["pending"] else 0
