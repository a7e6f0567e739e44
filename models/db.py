"""Database connection: one proxy every model binds to, initialised from `SVC_DATABASE_URL`."""
from __future__ import annotations

import json
import os
from urllib.parse import urlsplit

import peewee
from playhouse.db_url import connect

database = peewee.DatabaseProxy()


class JSONText(peewee.TextField):
    """JSON stored as text: the same on SQLite and PostgreSQL."""

    def db_value(self, value):
        return None if value is None else json.dumps(value, separators=(",", ":"), sort_keys=True)

    def python_value(self, value):
        return None if value is None else json.loads(value)


class BaseModel(peewee.Model):
    class Meta:
        database = database
        legacy_table_names = False


def open_database(url: str) -> peewee.Database:
    """Connect the model proxy to `url` (sqlite:///path or postgresql://...) and return it."""
    if url.startswith("sqlite:"):
        path = urlsplit(url).path
        if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
            path = url[len("sqlite:///"):]
        if path and path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        # WAL lets readers run beside a writer; busy_timeout makes concurrent writers
        # (several serve processes, the worker thread) wait instead of failing.
        db = peewee.SqliteDatabase(path or ":memory:", pragmas={
            "journal_mode": "wal", "busy_timeout": 10000, "foreign_keys": 1, "synchronous": "normal"})
    else:
        db = connect(url, autorollback=True)
    database.initialize(db)
    return db
