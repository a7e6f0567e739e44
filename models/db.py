"""Database connection: opened from `SVC_DATABASE_URL`; the runtime binds every model to it.

There is no process-wide database object: `Runtime` opens one with `open_database` and binds the
models to it with Peewee's `Database.bind` (see `models.schema.bind_models`).
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import os
import select
import sqlite3
import threading
import time
from urllib.parse import urlsplit

import peewee
from playhouse.db_url import parse
from playhouse.pool import PooledDatabase, PooledPostgresqlDatabase

log = logging.getLogger("svc_auth.db")

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


_JSON = json.JSONEncoder(separators=(",", ":"), sort_keys=True).encode


class JSONText(peewee.TextField):
    """JSON stored as text: the same on SQLite and PostgreSQL."""

    def db_value(self, value):
        """The JSON text of `value`; an empty object or array, or an array of strings (most rows'),
        without a pass through the encoder's machinery (the same text: the encoder gives each
        string as `_JSON(string)` does)."""
        kind = type(value)
        if kind is list and all(type(item) is str for item in value):
            return "[" + ",".join([_JSON(item) for item in value]) + "]"
        if kind is dict and not value:
            return "{}"
        return None if value is None else _JSON(value)

    def python_value(self, value):
        return None if value is None else json.loads(value)


class BaseModel(peewee.Model):
    class Meta:
        database = None  # bound by the runtime (models.schema.bind_models)
        legacy_table_names = False


def _switch_to_wal(path: str, seconds: float = 10.0) -> None:
    """Put the SQLite file in WAL mode (once per file: it stays so) before any connection of the
    pool opens it. The switch needs the file to itself; processes switching at once each hold a
    shared lock and want the exclusive one, and SQLite fails all but one at once ("database is
    locked", busy_timeout or not), so a loser tries again until the mode is WAL (two `db migrate`s
    started together on a restored database died that way)."""
    deadline = time.monotonic() + seconds
    while True:
        connection = sqlite3.connect(path, timeout=seconds)
        try:
            if connection.execute("PRAGMA journal_mode=wal").fetchone()[0] == "wal":
                return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise peewee.OperationalError(str(exc)) from None
        except sqlite3.Error as exc:  # not a database, say: peewee's error, as its connect would raise
            raise peewee.DatabaseError(str(exc)) from None
        finally:
            connection.close()
        if time.monotonic() >= deadline:
            raise peewee.OperationalError("database is locked: could not switch it to WAL")
        time.sleep(0.01)


def open_database(url: str, max_connections: int = 20) -> peewee.Database:
    """A database for `url` (sqlite:///path or postgresql://...); not bound to the models yet.

    PostgreSQL connections are pooled (`playhouse.pool`), bounded by `max_connections`. Request
    threads keep theirs between units of work (`HeldConnections`); the change feed gives its back
    (`release`). A connection found dead is replaced before it is used, a read it broke under is
    read again once (`ResilientPostgresqlDatabase`), and a failed one is thrown away (`discard`), so
    every thread and loop recovers by itself when the server comes back."""
    if url.startswith("sqlite:"):
        path = urlsplit(url).path
        if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
            path = url[len("sqlite:///"):]
        if path and path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            _switch_to_wal(path)
        # WAL lets readers run beside a writer; busy_timeout makes concurrent writers
        # (several serve processes, the worker thread) wait instead of failing. Transactions begin
        # IMMEDIATE: a deferred one that reads and then writes cannot upgrade its read snapshot once
        # another connection has written, and fails at once with "database is locked" (busy_timeout
        # does not apply); taking the write lock at BEGIN makes it wait its turn instead.
        return peewee.SqliteDatabase(path or ":memory:", lock_type="IMMEDIATE", pragmas={
            "journal_mode": "wal", "busy_timeout": 10000, "foreign_keys": 1, "synchronous": "full"})
    if url.partition("://")[0] not in ("postgres", "postgresql", "postgresext", "postgresqlext"):
        raise ValueError("SVC_DATABASE_URL must be sqlite:///path or postgresql://...")
    params = {"connect_timeout": CONNECT_TIMEOUT_SECONDS, **parse(url)}  # libpq's `?connect_timeout=` wins
    return ResilientPostgresqlDatabase(**params, autorollback=True, max_connections=max_connections,
                                       stale_timeout=STALE_SECONDS, timeout=POOL_WAIT_SECONDS)


def found_dead(conn) -> bool:
    """Whether an idle psycopg2 connection is known to be unusable, without a round trip.

    An idle connection receives nothing from the server. When PostgreSQL stops or restarts (or an
    administrator terminates the backend), it sends a FATAL message and closes the socket, so the
    socket turns readable: one `poll` system call tells, where asking the server costs a `SELECT 1`."""
    if conn.closed:
        return True
    try:
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


def _is_read(sql: str) -> bool:
    return sql.lstrip()[:6].upper() == "SELECT"


class ResilientPostgresqlDatabase(PooledPostgresqlDatabase):
    """Peewee's pooled PostgreSQL database that survives a server restart.

    - A connection found dead (`found_dead`) before a statement outside a transaction (a `BEGIN`
      included) is replaced, with every idle pooled one, before anything is sent on it: a thread
      or loop that held its connection across a restart carries on, with no error.
    - A statement that cannot have taken effect is retried once on a fresh connection: a read
      (`SELECT`) outside a transaction whose connection broke under it. A write whose connection
      broke may have committed before the break, so it is never repeated; its error goes up (a
      503 for a request, a logged failure and the next tick for a loop)."""

    def cursor(self, named_cursor=None):
        self._replace_if_dead()
        return super().cursor(named_cursor)

    def _replace_if_dead(self) -> None:
        if not self.is_closed() and not self.in_transaction() and found_dead(self.connection()):
            log.info("database connection found dead; opening a fresh one")
            discard(self)

    def ensure_connection(self) -> None:
        """This thread's connection, open and (outside a transaction) not known dead: before a block
        that manages its own transaction (Peewee's `connect` inside one would reset its state)."""
        self._replace_if_dead()
        self.connect(reuse_if_open=True)

    def execute_sql(self, sql, params=None):
        try:
            return super().execute_sql(sql, params)
        except DATABASE_ERRORS:
            if self.in_transaction() or self.is_closed() or not self.connection().closed or not _is_read(sql):
                raise
            log.info("database connection broke under a read; reading again on a fresh one")
            discard(self)
            return super().execute_sql(sql, params)


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

    def run(self, fn, /, *args, **kwargs):
        """`fn(*args, **kwargs)` on this thread's held connection; a database error drops it (and
        starts a new epoch) and goes up. Requests use it through `Runtime.unit_of_work`; the
        scheduler and the worker's sweeps run each tick through it."""
        self.begin()
        try:
            return fn(*args, **kwargs)
        except DATABASE_ERRORS:
            self.failed()
            raise



def sql_literal(value) -> str:
    """`value` (a str, bool or number, as a field's `db_value` gives it) as an SQL literal for DDL,
    the same on SQLite (3.23+) and PostgreSQL."""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    raise TypeError(f"no SQL literal for {type(value).__name__}")


def db_default(value) -> list:
    """`constraints=` of a field whose default lives in the database too (`DEFAULT <value>`), so a
    release that does not know the column yet can still insert rows (docs/operations.md, rolling
    upgrades). Peewee's `default=` alone is Python-side only."""
    return [peewee.SQL("DEFAULT " + sql_literal(value))]
