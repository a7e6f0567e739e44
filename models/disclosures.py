"""The disclosure audit's table: one row per disclosure of patient data, append-only, HMAC-chained.

No foreign key (nothing a delete can cascade through): ids are kept as text. `mac` links each row
to the one before it (`audit.chain`). On PostgreSQL `svc-auth db migrate` installs a trigger that
refuses UPDATE always, and DELETE and TRUNCATE unless the transaction set
`svc_auth.disclosure_maintenance = 'on'` (what `svc-auth audit prune` does); see docs/audit.md.
"""
from __future__ import annotations

import peewee

from models.db import BaseModel, JSONText

ACTIONS = ("read", "search", "appointments", "chart.request", "chart.url", "chart.download", "ehr.fetch")
CHECKPOINT = "audit.prune"
"""The action of the chain's checkpoint rows, written by a prune (not a disclosure: never listed)."""


class DisclosureRecord(BaseModel):
    seq = peewee.BigIntegerField(primary_key=True)  # 1, 2, 3...: given under the chain lock (audit.chain)
    at = peewee.DateTimeField(index=True)  # naive UTC, milliseconds
    action = peewee.CharField(max_length=32)
    outcome = peewee.CharField(max_length=16)
    status = peewee.IntegerField(null=True)
    organization_id = peewee.CharField(max_length=64, null=True, index=True)
    application_id = peewee.CharField(max_length=64, null=True)
    client_id = peewee.CharField(max_length=200, null=True)
    user_id = peewee.CharField(max_length=64, null=True)
    patients = JSONText(default=list)
    resource_type = peewee.CharField(max_length=64, default="")
    resource_ids = JSONText(default=list)
    query = peewee.TextField(default="")
    jti = peewee.CharField(max_length=200, null=True, index=True)  # an audit's and the retention sweep's look-up
    scope = peewee.TextField(null=True)
    source_address = peewee.CharField(max_length=64, null=True)
    request_id = peewee.CharField(max_length=128, null=True)
    detail = JSONText(default=dict)  # checkpoints only: what a prune removed and the chain's anchor
    mac = peewee.CharField(max_length=64)

    class Meta:
        table_name = "disclosure_record"


GUARD_FUNCTION = """
CREATE OR REPLACE FUNCTION disclosure_record_guard() RETURNS trigger AS $$
BEGIN
    IF TG_OP <> 'UPDATE' AND current_setting('svc_auth.disclosure_maintenance', true) = 'on' THEN
        RETURN NULL;  -- a statement-level trigger's result is ignored: the operation proceeds
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
        MESSAGE = 'disclosure_record is append-only: ' || TG_OP || ' refused (see docs/audit.md)';
END
$$ LANGUAGE plpgsql
"""
GUARD_TRIGGERS = (
    'DROP TRIGGER IF EXISTS disclosure_record_append_only ON "disclosure_record"',
    'CREATE TRIGGER disclosure_record_append_only BEFORE UPDATE OR DELETE ON "disclosure_record" '
    "FOR EACH STATEMENT EXECUTE FUNCTION disclosure_record_guard()",
    'DROP TRIGGER IF EXISTS disclosure_record_no_truncate ON "disclosure_record"',
    'CREATE TRIGGER disclosure_record_no_truncate BEFORE TRUNCATE ON "disclosure_record" '
    "FOR EACH STATEMENT EXECUTE FUNCTION disclosure_record_guard()",
)


def install_guard(migrator) -> None:
    """PostgreSQL: the append-only trigger (SQLite has no roles; the HMAC chain detects edits there)."""
    db = migrator.database
    if isinstance(db, peewee.SqliteDatabase):
        return
    db.execute_sql(GUARD_FUNCTION)
    for statement in GUARD_TRIGGERS:
        db.execute_sql(statement)
