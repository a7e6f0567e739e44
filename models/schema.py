"""Schema management: every table, created on start and by `svc-auth db migrate`.

New tables are created by listing their model in `MODELS`. A change to an existing table is a
numbered step in `MIGRATIONS`, applied once and recorded in `schema_version`.
"""
from __future__ import annotations

import peewee
from playhouse.migrate import PostgresqlMigrator, SqliteMigrator

from models.application import Application, Authorization, Installation
from models.appointments import ConnectorSession, Snapshot, SnapshotAppointment
from models.audit import AuditEvent
from models.billing import BillableUse
from models.charts import ChartRequest
from models.db import BaseModel
from models.directory import Organization, User
from models.grants import AuthorizationCode, IssuedToken, Launch
from models.invitations import Invitation
from models.schedule import ScheduledRun

MODELS: list[type[peewee.Model]] = [
    Organization, User, Application, Installation, Authorization,
    Launch, AuthorizationCode, IssuedToken, AuditEvent,
    Snapshot, SnapshotAppointment, ConnectorSession, ChartRequest, ScheduledRun, Invitation, BillableUse,
]

def _add_columns(table: str, *columns: tuple[str, peewee.Field]):
    """A migration step adding nullable columns (skipped where the table was just created with them)."""
    from playhouse.migrate import migrate as run

    def step(migrator):
        present = {c.name for c in migrator.database.get_columns(table)}
        run(*[migrator.add_column(table, name, field) for name, field in columns if name not in present])
    return step


# (version, description, function(migrator)) — append only.
MIGRATIONS: list[tuple[int, str, object]] = [
    (1, "issued_token.id_token: the platform hands the ID token to the SDK",
     _add_columns("issued_token", ("id_token", peewee.TextField(null=True)))),
    (2, "chart_request lease: re-queue requests whose worker died",
     _add_columns("chart_request", ("lease_owner", peewee.CharField(max_length=64, null=True)),
                  ("lease_until", peewee.DateTimeField(null=True)))),
    (3, "snapshot.lease_until: replace snapshots whose worker died",
     _add_columns("snapshot", ("lease_until", peewee.DateTimeField(null=True)))),
]


class SchemaVersion(BaseModel):
    version = peewee.IntegerField(primary_key=True)
    description = peewee.CharField(max_length=200)


def register(*models: type[peewee.Model]) -> None:
    """Add tables owned by another part of the service (workers, REST API)."""
    for model in models:
        if model not in MODELS:
            MODELS.append(model)


def bind_models(db: peewee.Database) -> None:
    """Make every model (and the schema bookkeeping) query `db` (Peewee's public `Database.bind`)."""
    db.bind([SchemaVersion, *MODELS])


def migrate(db: peewee.Database) -> list[str]:
    """Create missing tables in `db` and apply pending migrations; returns what was done."""
    done = []
    with db.atomic():
        existing = set(db.get_tables())
        db.create_tables([SchemaVersion, *MODELS], safe=True)
        done += [f"created table {m._meta.table_name}" for m in MODELS if m._meta.table_name not in existing]
        applied = {row.version for row in SchemaVersion.select()}
        migrator = SqliteMigrator(db) if isinstance(db, peewee.SqliteDatabase) else PostgresqlMigrator(db)
        for version, description, step in MIGRATIONS:
            if version in applied:
                continue
            step(migrator)
            SchemaVersion.create(version=version, description=description)
            done.append(f"migration {version}: {description}")
    return done
