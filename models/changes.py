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
    """The counted topics' versions, read in one query at most once per unit of work of a thread
    (`Runtime.unit_of_work` opens and closes it): the bearer gate's deny-list and directory checks
    of one request share it, as if both were made at the instant it was read. Outside a unit of
    work every call reads anew."""

    def __init__(self):
        self._local = threading.local()

    def begin(self) -> None:
        self._local.read, self._local.open = None, True

    def end(self) -> None:
        self._local.read, self._local.open = None, False

    def of(self, topic: str) -> int:
        read = getattr(self._local, "read", None)
        if read is None:
            read = _read_counted()
            if getattr(self._local, "open", False):
                self._local.read = read
        return read.get(topic, 0)


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
