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
from models.developers import ConsoleSession, Developer, DeveloperAccess, DeveloperInvite
from models.directory import Organization, User
from models.grants import AuthorizationCode, IssuedToken, Launch
from models.invitations import Invitation
from models.schedule import ScheduledRun

MODELS: list[type[peewee.Model]] = [
    Organization, User, Application, Installation, Authorization,
    Launch, AuthorizationCode, IssuedToken, AuditEvent,
    Snapshot, SnapshotAppointment, ConnectorSession, ChartRequest, ScheduledRun, Invitation, BillableUse,
    Developer, DeveloperAccess, DeveloperInvite, ConsoleSession,
]

# (version, description, function(migrator)) — append only.
MIGRATIONS: list[tuple[int, str, object]] = []


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
