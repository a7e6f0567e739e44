"""Database connection: opened from `SVC_DATABASE_URL`; the runtime binds every model to it.

There is no process-wide database object: `Runtime` opens one with `open_database` and binds the
models to it with Peewee's `Database.bind` (see `models.schema.bind_models`).
"""
from __future__ import annotations

import datetime as dt
import json
import os
from urllib.parse import urlsplit

import peewee
from playhouse.db_url import connect


def wall_now() -> dt.datetime:
    """Naive UTC now from the wall clock: the default of informational creation timestamps only.

    Times that rules depend on (expiry, consumption, revocation, trials, billing) are passed
    explicitly from the runtime's clock, so tests move them through the runtime."""
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


class JSONText(peewee.TextField):
    """JSON stored as text: the same on SQLite and PostgreSQL."""

    def db_value(self, value):
        return None if value is None else json.dumps(value, separators=(",", ":"), sort_keys=True)

    def python_value(self, value):
        return None if value is None else json.loads(value)


class BaseModel(peewee.Model):
    class Meta:
        database = None  # bound by the runtime (models.schema.bind_models)
        legacy_table_names = False


def open_database(url: str) -> peewee.Database:
    """A database for `url` (sqlite:///path or postgresql://...); not bound to the models yet."""
    if url.startswith("sqlite:"):
        path = urlsplit(url).path
        if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
            path = url[len("sqlite:///"):]
        if path and path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        # WAL lets readers run beside a writer; busy_timeout makes concurrent writers
        # (several serve processes, the worker thread) wait instead of failing.
        return peewee.SqliteDatabase(path or ":memory:", pragmas={
            "journal_mode": "wal", "busy_timeout": 10000, "foreign_keys": 1, "synchronous": "normal"})
    return connect(url, autorollback=True)
