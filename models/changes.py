"""Change versions: one counter per cached topic, bumped by whatever changes that topic."""
from __future__ import annotations

import threading

import peewee

from models.db import BaseModel


class ChangeVersion(BaseModel):
    """`topic` (e.g. `applications`, `signing_keys`) and how often it changed. Processes poll this
    table (and listen on Redis when configured) to drop what they cached."""

    topic = peewee.CharField(primary_key=True, max_length=64)
    version = peewee.BigIntegerField(default=0)


DIRECTORY = "directory"
"""Users, organizations and installations: the database bumps this topic itself, by a trigger on
every write to those tables in the writer's own transaction (`install_change_triggers`), so no
writer (a release before this one, an operator's SQL) can change them without it moving."""
DIRECTORY_TABLES = ("user", "organization", "installation")
DENIED = "denied"
"""The database deny-list (`denied_token`): bumped the same way by every row added or changed."""
COUNTED = (DIRECTORY, DENIED)
"""The topics the database's triggers count, read together (`Versions`)."""


class Versions:
    """The counted topics' versions, read at most once per unit of work of a thread
    (`Runtime.unit_of_work` opens and closes it): the bearer gate's deny-list and directory checks
    of one request share it, as if both were made at the instant it was read.

    One read also serves every unit of work asked for before it began (`mark`, taken when the work
    was handed to the pool: for a request, once it had arrived): a change committed before a
    request arrived is in any read begun after that, so the request sees it, as if it had read
    alone. The requests that arrive together (one IOLoop turn) thus share one query instead of
    making one each; each query through SQLite hands the GIL to another thread and back several
    times. Outside a unit of work every call reads anew."""

    def __init__(self):
        self._local = threading.local()
        self._lock = threading.Lock()
        self._started = 0  # reads begun so far: read number n began after every mark below n
        self._latest: tuple[int, dict | None] = (0, None)  # the newest finished read: (number, versions)
        self._pending: _Read | None = None  # the newest read in progress

    def mark(self) -> int:
        """Now, as this counts: any read numbered above it begins after this call."""
        return self._started

    def begin(self, asked_at: int | None = None) -> None:
        """A unit of work starts, for work asked for at `asked_at` (`mark()`; default: now)."""
        self._local.read, self._local.open = None, True
        self._local.asked_at = self._started if asked_at is None else asked_at

    def end(self) -> None:
        self._local.read, self._local.open = None, False

    def of(self, topic: str) -> int:
        read = getattr(self._local, "read", None)
        if read is None:
            if getattr(self._local, "open", False):
                read = self._local.read = self._read_after(self._local.asked_at)
            else:
                read = self._read_after(self._started)
        return read.get(topic, 0)

    def _read_after(self, asked_at: int) -> dict:
        """The versions of a read begun after `asked_at`: the newest finished one, the one in
        progress (waited for), or a new one."""
        while True:
            with self._lock:
                number, versions = self._latest
                if number > asked_at:
                    return versions
                pending = self._pending
                if pending is None or pending.number <= asked_at:
                    self._started += 1
                    pending = self._pending = _Read(self._started)
                    break
            pending.wait()  # begun after `asked_at`: its answer will do (or, if it fails, ask again)
        try:
            versions = _read_counted()
        except BaseException:
            self._finished(pending, None)
            raise
        self._finished(pending, versions)
        return versions

    def _finished(self, read: "_Read", versions: dict | None) -> None:
        """`read` is over: its versions (None: it failed) become the newest known, then its waiters wake."""
        with self._lock:
            if versions is not None and read.number > self._latest[0]:
                self._latest = (read.number, versions)
            if self._pending is read:
                self._pending = None
        read.done.release()


class _Read:
    """A read of the versions in progress: its number, and a lock held until it is over (cheaper
    than an Event, whose Condition a read that nobody waits for would still make and notify)."""

    __slots__ = ("number", "done")

    def __init__(self, number: int):
        self.number, self.done = number, threading.Lock()
        self.done.acquire()

    def wait(self) -> None:
        """Until the read is over; each waiter wakes the next."""
        self.done.acquire()
        self.done.release()


def _read_counted() -> dict[str, int]:
    db = ChangeVersion._meta.database
    marks = ", ".join([db.param] * len(COUNTED))
    return dict(db.execute_sql(f'SELECT topic, version FROM "change_version" WHERE topic IN ({marks})', COUNTED).fetchall())


_PG_FUNCTION = """
CREATE OR REPLACE FUNCTION svc_{topic}_changed() RETURNS trigger AS $$
BEGIN
  INSERT INTO "change_version" (topic, version) VALUES ('{topic}', 1)
  ON CONFLICT (topic) DO UPDATE SET version = "change_version".version + 1;
  RETURN NULL;
END;
$$ LANGUAGE plpgsql
"""


_COUNTED_TABLES = tuple((DIRECTORY, table, ("INSERT", "UPDATE", "DELETE")) for table in DIRECTORY_TABLES) + (
    (DENIED, "denied_token", ("INSERT", "UPDATE")),)  # deleting expired denials changes no live token


def install_change_triggers(migrator) -> None:
    """Every INSERT, UPDATE or DELETE (and TRUNCATE on PostgreSQL) of a user, organization or
    installation bumps the `directory` topic in the same transaction; every denial added or changed,
    the `denied` topic (migration 3505)."""
    db = migrator.database
    for topic in COUNTED:
        db.execute_sql(f'INSERT INTO "change_version" (topic, version) VALUES ({db.param}, 0) ON CONFLICT (topic) DO NOTHING',
                       (topic,))
    if isinstance(db, peewee.SqliteDatabase):
        for topic, table, events in _COUNTED_TABLES:
            for event in events:
                db.execute_sql(f'CREATE TRIGGER IF NOT EXISTS "{topic}_changed_{table}_{event.lower()}" '
                               f'AFTER {event} ON "{table}" BEGIN '
                               f"""INSERT OR IGNORE INTO "change_version" (topic, version) VALUES ('{topic}', 0); """
                               f"""UPDATE "change_version" SET version = version + 1 WHERE topic = '{topic}'; END""")
        return
    for topic, table, events in _COUNTED_TABLES:
        db.execute_sql(_PG_FUNCTION.format(topic=topic))
        events = " OR ".join(events + (("TRUNCATE",) if "DELETE" in events else ()))
        db.execute_sql(f'DROP TRIGGER IF EXISTS "{topic}_changed" ON "{table}"')
        db.execute_sql(f'CREATE TRIGGER "{topic}_changed" AFTER {events} ON "{table}" '
                       f"FOR EACH STATEMENT EXECUTE FUNCTION svc_{topic}_changed()")
