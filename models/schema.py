"""Schema management: every table, created on start and by `svc-auth db migrate`.

New tables are created by listing their model in `MODELS`. A change to an existing table is a
numbered step in `MIGRATIONS`, applied once and recorded in `schema_version`.

The runner (`migrate`) holds a lock while it works, so of several processes starting together one
migrates and the others find the schema up to date (PostgreSQL: an advisory lock; SQLite: an
exclusive lock on `<database>.migrate-lock`). PostgreSQL runs every pending step in one transaction
(transactional DDL); the runner's server process checks for a vanished client every second, so a
migrator killed mid-statement has it roll back and release its locks at once. SQLite runs them in one transaction with foreign keys OFF (the pragma only
takes effect outside a transaction): a step that rebuilds a table drops the old one, and with
foreign keys on that DROP would cascade to every row that references it. `PRAGMA
foreign_key_check` must come back empty before the transaction commits.

Rolling upgrades: a step only adds what the previous release can live with (new tables; columns
that are NULLable or have a DEFAULT in the database); `_add_missing_columns` gives a NOT NULL
column its default in the database, and adds it with one `ALTER TABLE ... ADD COLUMN` (no rebuild).
"""
from __future__ import annotations

import contextlib
import fcntl

import peewee
from playhouse.migrate import PostgresqlMigrator, SqliteMigrator

from models.application import DEFAULT_SMART_SCOPES, Application, Authorization, Installation
from models.assertions import SpentAssertion
from models.appointments import ONE_BUILDER, ConnectorSession, Snapshot, SnapshotAppointment
from models.audit import AuditEvent
from models.capability import ClinicCapability
from models.billing import BillableUse
from models.bulk import BulkExport, BulkExportFile
from models.changes import ChangeVersion, install_change_triggers
from models.charts import ChartRequest
from models.db import BaseModel, db_default, sql_literal
from models.denylist import DeniedToken
from models.disclosures import DisclosureRecord, install_guard
from models.developers import ConsoleSession, Developer, DeveloperAccess, DeveloperInvite
from models.directory import ONE_FACILITY, Organization, User
from models.hl7 import FeedAppointment, FeedMessage
from models.grants import AuthorizationCode, Launch
from models.refresh import RefreshToken, SmartGrant
from models.invitations import Invitation
from models.ehr import EhrClientKey
from models.key_holders import KeyHolder
from models.keys import SigningKeyRecord
from models.sandbox import SandboxSession, SandboxSigninLink
from models.schedule import ScheduledRun

MODELS: tuple[type[peewee.Model], ...] = (
    Organization, User, Application, Installation, Authorization,
    Launch, AuthorizationCode, AuditEvent, SigningKeyRecord, ChangeVersion, DeniedToken,
    Snapshot, SnapshotAppointment, ConnectorSession, ChartRequest, ScheduledRun, Invitation, BillableUse,
    SandboxSigninLink, SandboxSession,
    Developer, DeveloperAccess, DeveloperInvite, ConsoleSession, EhrClientKey, DisclosureRecord,
    SmartGrant, RefreshToken, FeedAppointment, FeedMessage, SpentAssertion, ClinicCapability, KeyHolder,
    BulkExport, BulkExportFile,  # issue 48: Bulk Data exports (new tables: no step)
)



def _add_missing_columns(table: str, *columns: tuple[str, peewee.Field]):
    """A migration step adding columns (skipped where the table was just created with them).

    Each is one `ALTER TABLE ... ADD COLUMN`; a NOT NULL column gets its Python default as a
    DEFAULT in the database too (both databases fill the existing rows with it, SQLite without
    rebuilding the table, and the previous release can still insert rows)."""
    def step(migrator):
        db = migrator.database
        present = {c.name for c in db.get_columns(table)}
        for name, field in columns:
            if name in present:
                continue
            field = field.clone()
            field.name = field.column_name = name
            if not field.null and not field.constraints:
                default = field.default() if callable(field.default) else field.default
                if default is None:
                    raise ValueError(f"{table}.{name} is NOT NULL without a default: the previous release "
                                     "could not insert rows")
                field.constraints = db_default(field.db_value(default))
            ctx = migrator.make_context()
            ctx.literal("ALTER TABLE ").sql(peewee.Entity(table)).literal(" ADD COLUMN ").sql(field.ddl(ctx))
            db.execute(ctx)
    return step


def _defaults_in_the_database(migrator) -> None:
    """Columns earlier steps added NOT NULL with a Python-side default only (SQLite rebuilt the table
    for them; PostgreSQL kept no DEFAULT) get their DEFAULT in the database, so a release that
    does not know them can insert rows. On SQLite each is a table rebuild (foreign keys are off)."""
    db = migrator.database
    for model in (Organization, Application):
        table = model._meta.table_name
        columns = {c.name: c for c in db.get_columns(table)}
        for field in model._meta.sorted_fields:
            column = columns.get(field.column_name)
            if column is None or column.null or column.default is not None or not field.constraints:
                continue
            default = field.default() if callable(field.default) else field.default
            value = field.db_value(default)
            if isinstance(migrator, SqliteMigrator):  # a literal peewee's SQLite rebuild keeps as it is
                migrator.add_column_default(table, field.column_name,
                                            str(int(value)) if isinstance(value, bool) else sql_literal(value)).run()
            else:
                migrator.add_column_default(table, field.column_name, peewee.SQL(sql_literal(value))).run()


def _keep_issued_token(migrator) -> None:
    """Tokens are no longer recorded one row each (revocation uses the deny-list), and nothing reads
    or writes `issued_token` any more; but an upgrade keeps its rows (0.1.0 wrote them), so this
    step changes nothing. It used to drop the table, which lost 0.1.0's rows (issue 36)."""


def _smart_launch(migrator) -> None:
    _add_missing_columns("application", ("smart_scopes", peewee.TextField(default=DEFAULT_SMART_SCOPES)),
                         ("public", peewee.BooleanField(default=False)))(migrator)
    _add_missing_columns("launch", ("patient_id", peewee.CharField(max_length=64, null=True)))(migrator)
    _add_missing_columns("authorization_code", ("patient_id", peewee.CharField(max_length=64, null=True)))(migrator)
    if not isinstance(migrator.database, peewee.SqliteDatabase):  # SQLite does not enforce varchar lengths
        migrator.database.execute_sql('ALTER TABLE "authorization_code" ALTER COLUMN "scope" TYPE TEXT')


def _sealed_totp_secrets(migrator) -> None:
    if not isinstance(migrator.database, peewee.SqliteDatabase):  # SQLite does not enforce varchar lengths
        for table in ("developer", "developer_invite"):
            migrator.database.execute_sql(f'ALTER TABLE "{table}" ALTER COLUMN "totp_secret" TYPE VARCHAR(200)')


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


R4_ID_COLUMNS = ((SnapshotAppointment.patient_id, "pat"), (SnapshotAppointment.ehr_appointment_id, "apt"),
                 (ChartRequest.patient_id, "pat"), (Launch.patient_id, "pat"), (AuthorizationCode.patient_id, "pat"))
"""Where ids the sandbox made are stored, and their kind (disclosure_record is append-only: not here)."""


def _r4_sandbox_ids(migrator) -> None:
    """Stored sandbox ids take R4's spelling (`pat_b15c…` -> `pat-b15c…`, `models.ids.sandbox_id`),
    one UPDATE per column. Rolling-upgrade safe: the previous release reads and serves the new
    spelling as any id (its sandbox no longer finds those patients: it 404s, as for an unknown one)."""
    for field, kind in R4_ID_COLUMNS:
        field.model.update({field: peewee.fn.REPLACE(field, "_", "-")}).where(field.startswith(f"{kind}_")).execute()


KEY_ID_TABLES = ("refresh_token", "authorization_code", "invitation", "developer_invite", "console_session",
                 "sandbox_session", "sandbox_signin_link")
"""Tables of keyed hashes whose rows note which SVC_HMAC_KEY made them (`keys.inventory`)."""


def _key_ids(migrator) -> None:
    """A NULL-able `key_id` on each (NULL: made before this release, under a key nobody noted)."""
    for table in KEY_ID_TABLES:
        _add_missing_columns(table, ("key_id", peewee.CharField(max_length=16, null=True)))(migrator)


def _hl7_feed_settings(migrator) -> None:
    _add_missing_columns("organization", ("schedule_source", peewee.CharField(max_length=8, default="ehr")),
                         ("hl7_facility", peewee.CharField(max_length=200, null=True)),
                         ("hl7_allow", peewee.TextField(default="[]")))(migrator)
    migrator.database.execute(ONE_FACILITY.safe())


def _ledger_outlives_what_it_names(migrator) -> None:
    """billable_use keeps its rows when an app, a clinic or a user is deleted: no foreign key (they
    cascaded, and `apps delete` erased the app's ledger, months not yet invoiced included), and
    the clinic's name and the user's email copied into each row (filled here from the current ones).

    PostgreSQL drops the foreign-key constraints, whatever their names; SQLite cannot, so it
    rebuilds the table (foreign keys are off: nothing references it), keeping every row and its id,
    and the same index names. Rolling-upgrade safe: the columns are the previous release's plus two
    NULLable ones; its inserts, joins and recursive deletes work as before (its `apps delete` still
    deletes the app's rows: delete apps with this release)."""
    db = migrator.database
    table = BillableUse._meta.table_name
    if isinstance(db, peewee.SqliteDatabase):
        if db.get_foreign_keys(table):
            db.execute_sql(f'ALTER TABLE "{table}" RENAME TO "{table}_before_5501"')
            for index in db.get_indexes(f"{table}_before_5501"):  # the names the new table's indexes take
                if not index.name.startswith("sqlite_autoindex_"):
                    db.execute_sql(f'DROP INDEX "{index.name}"')
            BillableUse._schema.create_table(safe=False)
            db.execute_sql(f'INSERT INTO "{table}" ("id", "application_id", "organization_id", "user_id", "month", '
                           f'"first_verified_at") SELECT "id", "application_id", "organization_id", "user_id", '
                           f'"month", "first_verified_at" FROM "{table}_before_5501"')
            db.execute_sql(f'DROP TABLE "{table}_before_5501"')
            BillableUse._schema.create_indexes(safe=True)
        else:  # created by this release (or rebuilt): only columns, if any, are missing
            _add_missing_columns(table, ("organization_name", BillableUse.organization_name),
                                 ("user_email", BillableUse.user_email))(migrator)
    else:
        for (name,) in db.execute_sql("SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass "
                                      "AND contype = 'f'", (f'"{table}"',)).fetchall():
            db.execute_sql(f'ALTER TABLE "{table}" DROP CONSTRAINT "{name}"')
        _add_missing_columns(table, ("organization_name", BillableUse.organization_name),
                             ("user_email", BillableUse.user_email))(migrator)
    (BillableUse.update(organization_name=Organization.select(Organization.name)
                        .where(Organization.id == BillableUse.organization_id))
     .where(BillableUse.organization_name.is_null()).execute())
    (BillableUse.update(user_email=User.select(User.email).where(User.id == BillableUse.user_id))
     .where(BillableUse.user_email.is_null()).execute())


MIGRATIONS: tuple[tuple[int, str, object], ...] = (
    # Codes note the jtis their exchange issued (replaces one issued_token row per token).
    (1, "authorization_code.issued_jtis",
     _add_missing_columns("authorization_code", ("issued_jtis", AuthorizationCode.issued_jtis))),
    (2, "issued_token no longer written (deny-list instead); its rows are kept", _keep_issued_token),
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
    # Issue 36 numbers its steps 36xx.
    (3611, "application.secret_key_id/fallback_key_id: which SVC_HMAC_KEY made a secret's hash (rotation)",
     _add_missing_columns("application", ("secret_key_id", peewee.CharField(max_length=16, null=True)),
                          ("fallback_key_id", peewee.CharField(max_length=16, null=True)))),
    # Issue 27 numbers its steps 27xx.
    (2701, "disclosure_record: append-only on PostgreSQL (a trigger refuses UPDATE, DELETE, TRUNCATE)", install_guard),
    # Issue 35 numbers its steps 35xx (item 4, R4-valid ids: 3504).
    (3504, "sandbox ids in R4's spelling (pat-…, apt-…) in appointments, chart requests, launches and codes",
     _r4_sandbox_ids),
    # Issue 36 numbers its steps 36xx.
    (3601, "organization, application: a DEFAULT in the database for every NOT NULL column steps added",
     _defaults_in_the_database),
    # Issue 34 numbers its steps 34xx (tables smart_grant and refresh_token are new: MODELS).
    (3401, "application.offline_access_ttl: an app's own offline_access lifetime (NULL: SVC_OFFLINE_ACCESS_TTL)",
     _add_missing_columns("application", ("offline_access_ttl", peewee.IntegerField(null=True)))),
    # Issue 35 item 6 (3505): the bearer gate keeps users and denials in memory, checked against these versions.
    (3505, "user, organization, installation, denied_token: triggers bump the `directory` and `denied` change "
           "versions on every write", install_change_triggers),
    # Issue 45 numbers its steps 45xx.
    (4501, "key_id beside every stored keyed hash (refresh tokens, codes, invitations, sessions, sign-in links): "
           "which SVC_HMAC_KEY made it (keys rekey counts what still needs an old key)", _key_ids),
    (4502, "key_holder: the SVC_HMAC_KEY each process linking disclosure records links under, with a heartbeat "
           "(keys rekey waits for live hosts on an old key)",
     lambda migrator: migrator.database.create_tables([KeyHolder], safe=True)),
    # Issue 47 numbers its steps 47xx (4751-4759: Epic's web service and the clinic's time zone, branch issue47e).
    (4751, "organization.time_zone: the IANA zone of times a feed or a web service sends without an offset",
     _add_missing_columns("organization", ("time_zone", peewee.CharField(max_length=64, default="UTC")))),
    (4752, "organization.epic_*: the Epic user, provider and patient id settings of GetProviderAppointments",
     _add_missing_columns("organization", ("epic_user_id", peewee.CharField(max_length=200, default="")),
                          ("epic_user_id_type", peewee.CharField(max_length=64, default="External")),
                          ("epic_provider_id_type", peewee.CharField(max_length=16, default="External")),
                          ("epic_provider_id_system", peewee.CharField(max_length=500, default="")),
                          ("epic_patient_id_system", peewee.CharField(max_length=500, default="")))),
    # The SIU feed (branch issue47h; tables feed_appointment and feed_message are new: MODELS).
    (4701, "organization: schedule source (ehr | siu), HL7 sending facility (unique) and allowed senders",
     _hl7_feed_settings),
    (4702, "organization.hl7_client_subjects: the client certificate subjects (CN) a clinic's feed may come from",
     _add_missing_columns("organization", ("hl7_client_subjects", peewee.TextField(default="[]")))),
    # Issue 48 numbers its steps 48xx (4801-4849: backend services, branch issue48a; table
    # spent_assertion is new: MODELS).
    (4801, "application.jwks_url, jwks, system_scopes: SMART Backend Services keys and system scopes",
     _add_missing_columns("application", ("jwks_url", peewee.CharField(max_length=500, null=True)),
                          ("jwks", peewee.TextField(null=True)),
                          ("system_scopes", peewee.TextField(default="")))),
    # 4850-4859: a FHIR clinic's EHR's own $export (branch issue48-ehr-export).
    (4850, "bulk_export.ehr_export: the status URL of a FHIR clinic's EHR's own $export a job reads (or its fallback)",
     _add_missing_columns("bulk_export", ("ehr_export", peewee.TextField(null=True)))),
    # The OAuth security review (branch rev-oauth) numbers its steps 49xx.
    (4901, "authorization_code.replayed_at: a replayed code stops the refresh grant its first use is starting",
     _add_missing_columns("authorization_code", ("replayed_at", peewee.DateTimeField(null=True)))),
    # Retention of short-lived rows (branch retain) numbers its steps 51xx.
    (5101, "indexes for the retention sweep: disclosure_record.jti (a record's token), launch (app, user, created_at)",
     lambda migrator: [model._schema.create_indexes(safe=True) for model in (DisclosureRecord, Launch)]),
    # The HL7 feed's limits (branch hl7-limits) number its steps 527x.
    (5271, "feed_message.sent_at, note: a message's MSH-7 as read, and what was done besides (an MSH-7 ahead "
           "of our clock is ordered as received)",
     _add_missing_columns("feed_message", ("sent_at", peewee.DateTimeField(null=True)),
                          ("note", peewee.CharField(max_length=200, null=True)))),
    # The snapshot lease's owner (branch snaplease) numbers its steps 53xx.
    (5301, "snapshot.lease_owner: a builder that lost its lease changes nothing of the next builder's snapshot",
     _add_missing_columns("snapshot", ("lease_owner", peewee.CharField(max_length=64, null=True)))),
    # The billing ledger kept through deletions (branch ledger) numbers its steps 55xx.
    (5501, "billable_use: no foreign keys (deleting an app, clinic or user keeps its ledger); the clinic's name "
           "and the user's email copied into each row", _ledger_outlives_what_it_names),
    # The operations security review (branch rev-ops) numbers its steps 565x.
    (5651, "developer, developerinvite.totp_secret: room for the sealed TOTP secret (a dump no longer shows it)",
     _sealed_totp_secrets),
)


class SchemaVersion(BaseModel):
    version = peewee.IntegerField(primary_key=True)
    description = peewee.CharField(max_length=200)


def bind_models(db: peewee.Database) -> None:
    """Make every model (and the schema bookkeeping) query `db` (Peewee's public `Database.bind`)."""
    db.bind([SchemaVersion, *MODELS])


class MigrationError(RuntimeError):
    """A migration that would leave the database inconsistent (rolled back; nothing changed)."""


def pending_steps(db: peewee.Database) -> list[dict]:
    """What `migrate` would do: `{"table": name}` to create, `{"migration": N, "description": ...}`
    to apply (empty: up to date)."""
    existing = set(db.get_tables())
    todo = [{"table": m._meta.table_name} for m in (SchemaVersion, *MODELS) if m._meta.table_name not in existing]
    applied = set()
    if SchemaVersion._meta.table_name in existing:
        applied = {row.version for row in SchemaVersion.select(SchemaVersion.version)}
    return todo + [{"migration": version, "description": description} for version, description, _ in MIGRATIONS
                   if version not in applied]


def schema_number(db: peewee.Database) -> int:
    """The database's schema number: the highest migration applied (0 when none, or no table)."""
    if SchemaVersion._meta.table_name not in db.get_tables():
        return 0
    return SchemaVersion.select(peewee.fn.MAX(SchemaVersion.version)).scalar() or 0


def code_schema_number() -> int:
    """The schema number this code brings a database to: its highest migration."""
    return max(version for version, _, _ in MIGRATIONS)


@contextlib.contextmanager
def migration_lock(db: peewee.Database):
    """One migrator at a time, across processes and hosts: PostgreSQL's session advisory lock, or
    an exclusive `flock` on `<database>.migrate-lock` beside an SQLite file (none for `:memory:`)."""
    if isinstance(db, peewee.SqliteDatabase):
        if db.database in ("", ":memory:"):
            yield
            return
        with open(f"{db.database}.migrate-lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        return
    _check_the_client(db, CLIENT_CHECK_INTERVAL)
    db.execute_sql("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
    try:
        yield
    finally:
        db.execute_sql("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
        _check_the_client(db, None)


MIGRATION_LOCK_KEY = 0x5356_4341_3336  # pg_advisory_lock's key for the migration runner ("SVCA36")
CLIENT_CHECK_INTERVAL = "1s"
"""How often the migrator's PostgreSQL server process checks that the migrator is still there."""


def _check_the_client(db: peewee.Database, interval: str | None) -> None:
    """Set the session's `client_connection_check_interval` (None: back to its default). A migrator
    killed mid-statement (a deploy's timeout, an OOM kill) then has its server process stop within
    the interval and roll back; without it the server process runs the statement, or waits for a
    lock, to the end, holding the advisory lock and its table locks all that time. PostgreSQL
    before 14 has no such setting (no row: nothing set); a platform without the check accepts 0 only."""
    try:
        db.execute_sql("SELECT set_config(name, COALESCE(%s, reset_val), false) FROM pg_settings "
                       "WHERE name = 'client_connection_check_interval'", (interval,))
    except peewee.DatabaseError:  # that platform: as before (autocommit: nothing left aborted)
        pass


def migrate(db: peewee.Database, before_change=None) -> list[str]:
    """Create missing tables in `db` and apply pending migrations, under `migration_lock`; returns
    what was done (empty: it was up to date, and nothing was written). `before_change()` runs under
    the lock just before the first change (`db migrate` writes its SQLite backup there)."""
    if not pending_steps(db):
        return []  # up to date: no DDL and no lock, so a service role without CREATE rights starts
    with migration_lock(db):
        if not pending_steps(db):
            return []  # another process migrated while this one waited for the lock
        done = [line for line in [before_change()] if line] if before_change else []
        if not isinstance(db, peewee.SqliteDatabase):
            with db.atomic():
                return done + _apply(db, PostgresqlMigrator(db))
        db.execute_sql("PRAGMA foreign_keys = OFF")  # outside the transaction, or it is ignored
        try:
            with db.atomic():
                done += _apply(db, SqliteMigrator(db))
                broken = db.execute_sql("PRAGMA foreign_key_check").fetchall()
                if broken:
                    table, rowid, parent, _ = broken[0]
                    raise MigrationError(f"migration rolled back, nothing changed: {len(broken)} row(s) would "
                                         f"reference a missing row (first: {table} rowid {rowid} -> {parent}); "
                                         "PRAGMA foreign_key_check lists them")
        finally:
            db.execute_sql("PRAGMA foreign_keys = ON")
        return done


def _apply(db: peewee.Database, migrator) -> list[str]:
    """Create missing tables and apply the pending steps, in the caller's transaction."""
    done = []
    existing = set(db.get_tables())
    db.create_tables([SchemaVersion, *MODELS], safe=True)
    done += [f"created table {m._meta.table_name}" for m in MODELS if m._meta.table_name not in existing]
    applied = {row.version for row in SchemaVersion.select()}
    for version, description, step in MIGRATIONS:
        if version in applied:
            continue
        step(migrator)
        SchemaVersion.create(version=version, description=description)
        done.append(f"migration {version}: {description}")
    return done
