"""Bulk Data exports (FHIR Bulk Data Access 2.0): a backend app's job, and the files it wrote.

A kick-off creates a `BulkExport` (status `pending`) and queues its task (`workers.export`). The
task leases the job as a chart build is leased (`lease_owner`, `lease_until`), writes one type
at a time into the object store, and records each file (`BulkExportFile`) only once the object is
complete there; a type is added to `done_types` once all its files are recorded. A worker killed
mid-type leaves that type's files unrecorded (or recorded for a type not done, which the next
delivery removes before it writes the type again), so the manifest, built only from a `complete`
job's rows, never lists a truncated file. `expires_at` is when the sweep deletes the job and its
objects (`workers.export.sweep_exports`). A job DELETEd while a delivery builds it is `cancelled`
(its files gone, the API answers 404) until that build stops and removes it (`bulk.build.cancel_export`).
"""
from __future__ import annotations

import secrets

import peewee

from models.application import Application
from models.db import BaseModel, JSONText, wall_now
from models.directory import Organization

EXPORT_STATUSES = ("pending", "complete", "failed", "cancelled")


def new_export_id() -> str:
    """32 lower-case hex characters: unguessable (the status URL names it)."""
    return secrets.token_hex(16)


class BulkExport(BaseModel):
    id = peewee.CharField(primary_key=True, max_length=64, default=new_export_id)
    application = peewee.ForeignKeyField(Application, on_delete="CASCADE")
    organization = peewee.ForeignKeyField(Organization, on_delete="CASCADE")
    client_id = peewee.CharField(max_length=255, default="")
    level = peewee.CharField(max_length=16)            # system | patient | group
    group_id = peewee.CharField(max_length=64, null=True)
    request_url = peewee.TextField()                    # the kick-off URL, as the manifest's `request`
    parameters = JSONText()                             # `bulk.params.ExportParameters.as_json()`
    status = peewee.CharField(max_length=16, default="pending")
    created_at = peewee.DateTimeField(default=wall_now)
    transaction_time = peewee.DateTimeField()
    completed_at = peewee.DateTimeField(null=True)
    expires_at = peewee.DateTimeField(null=True)
    error = peewee.TextField(null=True)
    error_status = peewee.IntegerField(null=True)
    done_types = JSONText(default=list)                 # the types whose files are all recorded
    resources_written = peewee.IntegerField(default=0)  # progress: resources in the recorded files
    polled = peewee.BooleanField(default=False)         # the first status poll always answers 202
    attempts = peewee.IntegerField(default=0)
    lease_owner = peewee.CharField(max_length=64, null=True)
    lease_until = peewee.DateTimeField(null=True)
    # A FHIR clinic's EHR's own export this job reads (`bulk.ehr_export`): None (not decided, or not
    # used), {"status_url": ...} (kicked off at the EHR: a later delivery polls it again), or
    # {"fallback": reason} (it failed: the per-patient path).
    ehr_export = JSONText(null=True)

    class Meta:
        indexes = ((("application", "status"), False), (("status", "lease_until"), False))


class BulkExportFile(BaseModel):
    """One complete ndjson file of an export, with the patients it names (its downloads' record)."""

    export = peewee.ForeignKeyField(BulkExport, on_delete="CASCADE", backref="files")
    resource_type = peewee.CharField(max_length=64)
    part = peewee.IntegerField()
    object_key = peewee.CharField(max_length=300)
    count = peewee.IntegerField()
    size = peewee.BigIntegerField()
    patients = JSONText(default=list)

    class Meta:
        indexes = ((("export", "resource_type", "part"), True),)
