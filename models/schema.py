"""Schema management: every table, created on start and by `svc-auth db migrate`.

New tables are created by listing their model in `MODELS`. A change to an existing table is a
numbered step in `MIGRATIONS`, applied once and recorded in `schema_version`.
"""
from __future__ import annotations

import peewee
from playhouse.migrate import PostgresqlMigrator, SqliteMigrator, migrate as migrate_columns

from models.application import DEFAULT_SMART_SCOPES, Application, Authorization, Installation
from models.appointments import ONE_BUILDER, ConnectorSession, Snapshot, SnapshotAppointment
from models.audit import AuditEvent
from models.billing import BillableUse
from models.changes import ChangeVersion
from models.charts import ChartRequest
from models.db import BaseModel
from models.denylist import DeniedToken
from models.disclosures import DisclosureRecord, install_guard
from models.developers import ConsoleSession, Developer, DeveloperAccess, DeveloperInvite
from models.directory import Organization, User
from models.grants import AuthorizationCode, Launch
from models.refresh import RefreshToken, SmartGrant
from models.invitations import Invitation
from models.ehr import EhrClientKey
from models.keys import SigningKeyRecord
from models.sandbox import SandboxSession, SandboxSigninLink
from models.schedule import ScheduledRun

MODELS: tuple[type[peewee.Model], ...] = (
    Organization, User, Application, Installation, Authorization,
    Launch, AuthorizationCode, AuditEvent, SigningKeyRecord, ChangeVersion, DeniedToken,
    Snapshot, SnapshotAppointment, ConnectorSession, ChartRequest, ScheduledRun, Invitation, BillableUse,
    SandboxSigninLink, SandboxSession,
    Developer, DeveloperAccess, DeveloperInvite, ConsoleSession, EhrClientKey, DisclosureRecord,
    SmartGrant, RefreshToken,
)



def _add_missing_columns(table: str, *columns: tuple[str, peewee.Field]):
    """A migration step adding columns (skipped where the table was just created with them)."""
    def step(migrator):
        present = {c.name for c in migrator.database.get_columns(table)}
        fields = [migrator.add_column(table, name, field) for name, field in columns if name not in present]
        if fields:
            migrate_columns(*fields)
    return step


def _drop_issued_token(migrator) -> None:
    """Tokens are no longer recorded one row each; revocation uses the deny-list."""
    migrator.database.execute_sql('DROP TABLE IF EXISTS "issued_token"')


def _smart_launch(migrator) -> None:
    _add_missing_columns("application", ("smart_scopes", peewee.TextField(default=DEFAULT_SMART_SCOPES)),
                         ("public", peewee.BooleanField(default=False)))(migrator)
    _add_missing_columns("launch", ("patient_id", peewee.CharField(max_length=64, null=True)))(migrator)
    _add_missing_columns("authorization_code", ("patient_id", peewee.CharField(max_length=64, null=True)))(migrator)
    if not isinstance(migrator.database, peewee.SqliteDatabase):  # SQLite does not enforce varchar lengths
        migrator.database.execute_sql('ALTER TABLE "authorization_code" ALTER COLUMN "scope" TYPE TEXT')


# (version, description, function(migrator)) — append only.
def _one_snapshot_builder(migrator) -> None:
    """Keep the newest `building` row of each (organization, night), then add the unique index."""
    seen, extra = set(), []
    for row in (Snapshot.select(Snapshot.id, Snapshot.organization, Snapshot.snapshot_date)
                .where(Snapshot.status == "building").order_by(Snapshot.id.desc())):
        night = (row.organization_id, row.snapshot_date)
        if night in seen:
            extra.append(row.id)
        seen.add(night)
    if extra:
        SnapshotAppointment.delete().where(SnapshotAppointment.snapshot.in_(extra)).execute()
        Snapshot.delete().where(Snapshot.id.in_(extra)).execute()
    migrator.database.execute(ONE_BUILDER.safe())


MIGRATIONS: tuple[tuple[int, str, object], ...] = (
    # Codes note the jtis their exchange issued (replaces one issued_token row per token).
    (1, "authorization_code.issued_jtis",
     _add_missing_columns("authorization_code", ("issued_jtis", AuthorizationCode.issued_jtis))),
    (2, "drop issued_token (deny-list instead)", _drop_issued_token),
    # Issue 12 numbers its steps 12xx.
    (1201, "application.redirect_uri_match and redirect_uris: exact redirect_uri matching per app",
     _add_missing_columns("application", ("redirect_uri_match", peewee.CharField(max_length=16, default="prefix")),
                          ("redirect_uris", peewee.TextField(default="[]")))),
    (1202, "PKCE: application.require_pkce",
     _add_missing_columns("application", ("require_pkce", peewee.BooleanField(default=False)))),
    (1203, "PKCE: authorization_code.code_challenge",
     _add_missing_columns("authorization_code", ("code_challenge", peewee.CharField(max_length=64, null=True)))),
    # Issue 13 numbers its steps 13xx.
    (1301, "chart_request lease: re-queue requests whose worker died",
     _add_missing_columns("chart_request", ("lease_owner", peewee.CharField(max_length=64, null=True)),
                          ("lease_until", peewee.DateTimeField(null=True)))),
    (1302, "snapshot.lease_until: replace snapshots whose worker died",
     _add_missing_columns("snapshot", ("lease_until", peewee.DateTimeField(null=True)))),
    # Issue 14 numbers its steps 14xx.
    (1401, "launches and authorization codes carry auth_time; codes carry their scope",
     lambda m: (_add_missing_columns("launch", ("auth_time", peewee.BigIntegerField(null=True)))(m),
                _add_missing_columns("authorization_code", ("auth_time", peewee.BigIntegerField(null=True)),
                                     ("scope", peewee.CharField(max_length=200, null=True)))(m))),
    # Issue 15 numbers its steps 15xx.
    (1501, "developer.totp_last_step: an authenticator code is accepted once",
     _add_missing_columns("developer", ("totp_last_step", peewee.BigIntegerField(null=True)))),
    # Issue 18 numbers its steps 18xx.
    (1801, "snapshot: one building row per organization and night (builders cooperate)", _one_snapshot_builder),
    # Issue 20 numbers its steps 20xx.
    (2001, "organization: the FHIR connector's client id and authentication",
     _add_missing_columns("organization", ("fhir_client_id", peewee.CharField(max_length=200, default="")),
                          ("fhir_auth", peewee.CharField(max_length=32, default="smart-backend")))),
    # Issue 21 numbers its steps 21xx.
    (2101, "SMART: declared scopes and public clients; a launch's and a code's patient; codes' scope as text",
     _smart_launch),
    # Issue 26 numbers its steps 26xx (2651-2659: EHR vendor profiles, branch ehrvendors).
    (2651, "organization: the FHIR EHR's vendor profile, scope syntax and extra search parameters",
     _add_missing_columns("organization", ("fhir_profile", peewee.CharField(max_length=32, default="generic")),
                          ("fhir_scopes", peewee.CharField(max_length=8, default="auto")),
                          ("fhir_search_params", peewee.TextField(default="[]")))),
    (2652, "snapshot.skipped: what a night left out, by reason",
     _add_missing_columns("snapshot", ("skipped", peewee.TextField(null=True)))),
    # Issue 28 numbers its steps 28xx (item 6: 2806).
    (2806, "application: its own FHIR API rate limits (per clinic and per token)",
     _add_missing_columns("application", ("fhir_rate_limit", peewee.CharField(max_length=32, null=True)),
                          ("fhir_token_rate_limit", peewee.CharField(max_length=32, null=True)))),
    # Issue 29 numbers its steps 29xx.
    (2903, "application.retired_secret_hash/_until: a secret retired by rotation is recognised, not counted",
     _add_missing_columns("application", ("retired_secret_hash", peewee.CharField(max_length=128, null=True)),
                          ("retired_secret_until", peewee.DateTimeField(null=True)))),
    # Issue 27 numbers its steps 27xx.
    (2701, "disclosure_record: append-only on PostgreSQL (a trigger refuses UPDATE, DELETE, TRUNCATE)", install_guard),
    # Issue 34 numbers its steps 34xx (tables smart_grant and refresh_token are new: MODELS).
    (3401, "application.offline_access_ttl: an app's own offline_access lifetime (NULL: SVC_OFFLINE_ACCESS_TTL)",
     _add_missing_columns("application", ("offline_access_ttl", peewee.IntegerField(null=True)))),
)


class SchemaVersion(BaseModel):
    version = peewee.IntegerField(primary_key=True)
    description = peewee.CharField(max_length=200)


def bind_models(db: peewee.Database) -> None:
    """Make every model (and the schema bookkeeping) query `db` (Peewee's public `Database.bind`)."""
    db.bind([SchemaVersion, *MODELS])


def migrate(db: peewee.Database) -> list[str]:
    """Create missing tables in `db` and apply pending migrations; returns what was done."""
    done = []
    existing = set(db.get_tables())
    if all(m._meta.table_name in existing for m in (SchemaVersion, *MODELS)):
        applied = {row.version for row in SchemaVersion.select(SchemaVersion.version)}
        if all(version in applied for version, _, _ in MIGRATIONS):
            return done  # up to date: no DDL, so a service role without CREATE rights starts (docs/operations.md)
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
