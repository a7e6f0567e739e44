"""Change versions: one counter per cached topic, bumped by whatever changes that topic."""
from __future__ import annotations

import peewee

from models.db import BaseModel
from models.prepared import PreparedQuery


class ChangeVersion(BaseModel):
    """`topic` (e.g. `applications`, `signing_keys`) and how often it changed. Processes poll this
    table (and listen on Redis when configured) to drop what they cached."""

    topic = peewee.CharField(primary_key=True, max_length=64)
    version = peewee.BigIntegerField(default=0)


DIRECTORY = "directory"
"""Users, organizations and installations: the database bumps this topic itself, by a trigger on
every write to those tables in the writer's own transaction (`install_directory_triggers`), so no
writer (a release before this one, an operator's SQL) can change them without it moving."""
DIRECTORY_TABLES = ("user", "organization", "installation")

_VERSION = PreparedQuery(lambda topic: ChangeVersion.select(ChangeVersion.version).where(ChangeVersion.topic == topic),
                         ChangeVersion.topic)


def version_of(topic: str) -> int:
    """The topic's version now (0 when it never changed)."""
    rows = _VERSION.dicts(topic)
    return rows[0]["version"] if rows else 0


_PG_FUNCTION = """
CREATE OR REPLACE FUNCTION svc_directory_changed() RETURNS trigger AS $$
BEGIN
  INSERT INTO "change_version" (topic, version) VALUES ('directory', 1)
  ON CONFLICT (topic) DO UPDATE SET version = "change_version".version + 1;
  RETURN NULL;
END;
$$ LANGUAGE plpgsql
"""


def install_directory_triggers(migrator) -> None:
    """Every INSERT, UPDATE or DELETE (and TRUNCATE on PostgreSQL) of a user, organization or
    installation bumps the `directory` topic in the same transaction (migration 3505)."""
    db = migrator.database
    db.execute_sql("INSERT INTO \"change_version\" (topic, version) VALUES ('directory', 0) ON CONFLICT (topic) DO NOTHING")
    if isinstance(db, peewee.SqliteDatabase):
        for table in DIRECTORY_TABLES:
            for event in ("INSERT", "UPDATE", "DELETE"):
                db.execute_sql(f'CREATE TRIGGER IF NOT EXISTS "directory_changed_{table}_{event.lower()}" '
                               f'AFTER {event} ON "{table}" BEGIN UPDATE "change_version" '
                               f"SET version = version + 1 WHERE topic = 'directory'; END")
        return
    db.execute_sql(_PG_FUNCTION)
    for table in DIRECTORY_TABLES:
        db.execute_sql(f'DROP TRIGGER IF EXISTS "directory_changed" ON "{table}"')
        db.execute_sql(f'CREATE TRIGGER "directory_changed" AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON "{table}" '
                       "FOR EACH STATEMENT EXECUTE FUNCTION svc_directory_changed()")
