"""Database connection: opened from `SVC_DATABASE_URL`; the runtime binds every model to it.

There is no process-wide database object: `Runtime` opens one with `open_database` and binds the
models to it with Peewee's `Database.bind` (see `models.schema.bind_models`).
"""
from __future__ import annotations

import datetime as dt
import json
import os
import threading
from urllib.parse import urlsplit

import peewee
from playhouse.db_url import connect
from playhouse.pool import PooledDatabase

DATABASE_ERRORS = (peewee.OperationalError, peewee.InterfaceError)
"""What a database that went away (or is locked past its timeout) raises: never a client's fault."""

CONNECT_TIMEOUT_SECONDS = 3   # a PostgreSQL host that does not answer fails fast, not after minutes
STALE_SECONDS = 300           # pooled connections older than this are reopened at checkout
POOL_WAIT_SECONDS = 10        # a unit of work waits this long for a free pooled connection


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


def open_database(url: str, max_connections: int = 20) -> peewee.Database:
    """A database for `url` (sqlite:///path or postgresql://...); not bound to the models yet.

    PostgreSQL connections are pooled (`playhouse.pool`), bounded by `max_connections`. Request
    threads keep theirs between units of work (`HeldConnections`); the change feed gives its back
    (`release`). A broken one is thrown away (`discard`) and the next unit of work opens a fresh
    one, so the service recovers by itself when the server comes back."""
    if url.startswith("sqlite:"):
        path = urlsplit(url).path
        if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
            path = url[len("sqlite:///"):]
        if path and path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        # WAL lets readers run beside a writer; busy_timeout makes concurrent writers
        # (several serve processes, the worker thread) wait instead of failing. Transactions begin
        # IMMEDIATE: a deferred one that reads and then writes cannot upgrade its read snapshot once
        # another connection has written, and fails at once with "database is locked" (busy_timeout
        # does not apply); taking the write lock at BEGIN makes it wait its turn instead.
        return peewee.SqliteDatabase(path or ":memory:", lock_type="IMMEDIATE", pragmas={
            "journal_mode": "wal", "busy_timeout": 10000, "foreign_keys": 1, "synchronous": "normal"})
    scheme, _, rest = url.partition("://")
    pooled = {"postgres": "postgres+pool", "postgresql": "postgresql+pool"}.get(scheme, scheme)
    return connect(f"{pooled}://{rest}", autorollback=True, max_connections=max_connections,
                   stale_timeout=STALE_SECONDS, timeout=POOL_WAIT_SECONDS, connect_timeout=CONNECT_TIMEOUT_SECONDS)


def release(db: peewee.Database) -> None:
    """End of a unit of work: give this thread's pooled connection back (SQLite keeps its own)."""
    if isinstance(db, PooledDatabase) and not db.is_closed():
        db.close()


def discard(db: peewee.Database) -> None:
    """This thread's connection failed: close it for good, and every idle pooled one with it (they
    were opened before the same outage), so the next unit of work starts on a fresh connection."""
    try:
        if isinstance(db, PooledDatabase):
            db.manual_close()
            db.close_idle()
        elif not db.is_closed():
            db.close()
    except DATABASE_ERRORS:
        pass  # closing a dead connection may fail the same way; it is gone either way


class HeldConnections:
    """Each thread keeps its database connection from one unit of work to the next.

    Checking a pooled connection out costs PostgreSQL a `SELECT 1` round trip (playhouse.pool asks
    the server whether the connection is alive), which doubles a one-statement request when the
    database is a millisecond away. So threads hold theirs, and a failure decides instead: the
    thread that failed discards its connection and starts a new epoch, and every other thread drops
    its connection, opened before the same outage, before its next unit of work rather than failing
    on it."""

    def __init__(self, db: peewee.Database):
        self.db = db
        self.epoch = 0
        self._seen = threading.local()

    def begin(self) -> None:
        """Start of a unit of work on this thread: reopen if an outage was seen since it connected."""
        if getattr(self._seen, "epoch", 0) != self.epoch:
            self._seen.epoch = self.epoch
            discard(self.db)

    def failed(self) -> None:
        """This thread's connection failed: drop it, and have every other thread drop its own."""
        self.epoch += 1
        self._seen.epoch = self.epoch
        discard(self.db)

