"""Nightly appointment snapshots: one per organization and night, switched to atomically.

The worker fills a `Snapshot` in state `building`, then marks it `complete` in one transaction;
readers only ever read the newest complete snapshot of an organization, so they never see a
half-written night and keep serving yesterday's while today's is built.
"""
from __future__ import annotations

import peewee

from models.db import BaseModel, wall_now
from models.directory import Organization, User
from models.prepared import PreparedQuery


class Snapshot(BaseModel):
    organization = peewee.ForeignKeyField(Organization, on_delete="CASCADE")
    snapshot_date = peewee.DateField()
    status = peewee.CharField(max_length=16, default="building")  # building | complete
    started_at = peewee.DateTimeField(default=wall_now)
    completed_at = peewee.DateTimeField(null=True)
    # A `building` snapshot's worker renews this while it writes; once it lapses the worker is gone
    # and the sweep (workers.recovery) removes the snapshot and re-queues its organization's night.
    lease_until = peewee.DateTimeField(null=True)
    # The token of the build that holds the `building` row (workers.snapshot.claim_build): its renewals,
    # rows, publish and discard apply only while the row is still its own (SQLite reuses the id of a
    # deleted newest row, so a builder that lost its lease could otherwise find the next one's row).
    lease_owner = peewee.CharField(max_length=64, null=True)
    # JSON {reason: {"count", "appointments": [first ids]}}: what the EHR sent that the night left out.
    skipped = peewee.TextField(null=True)

    class Meta:
        indexes = ((("organization", "status", "snapshot_date"), False),)

    @classmethod
    def latest_complete(cls, organization_id: str) -> "Snapshot | None":
        return _LATEST_COMPLETE.first(organization_id)


# One builder per (organization, night): a second `building` row of the same night is refused
# (workers.snapshot.claim_build), so builders never destroy each other's work.
ONE_BUILDER = Snapshot.index(Snapshot.organization, Snapshot.snapshot_date, unique=True,
                             where=(Snapshot.status == "building"), name="snapshot_one_builder")
Snapshot.add_index(ONE_BUILDER)

_LATEST_COMPLETE = PreparedQuery(
    lambda organization_id: (
        Snapshot.select().where((Snapshot.organization == organization_id) & (Snapshot.status == "complete"))
        .order_by(Snapshot.snapshot_date.desc(), Snapshot.completed_at.desc(), Snapshot.id.desc()).limit(1)),
    Snapshot.organization)


class SnapshotAppointment(BaseModel):
    """One appointment as the EHR showed it on the snapshot night."""

    snapshot = peewee.ForeignKeyField(Snapshot, on_delete="CASCADE")
    ehr_appointment_id = peewee.CharField(max_length=64)
    provider = peewee.ForeignKeyField(User, on_delete="CASCADE")
    provider_npi = peewee.CharField(max_length=10)
    provider_name = peewee.CharField(max_length=200)
    start = peewee.DateTimeField()
    end = peewee.DateTimeField()
    status = peewee.CharField(max_length=32)
    appointment_type = peewee.CharField(max_length=64)
    reason = peewee.CharField(max_length=500, default="")
    location = peewee.CharField(max_length=200, default="")
    patient_id = peewee.CharField(max_length=64)
    patient_first_name = peewee.CharField(max_length=100)
    patient_last_name = peewee.CharField(max_length=100)
    patient_date_of_birth = peewee.DateField()
    patient_sex = peewee.CharField(max_length=16)

    class Meta:
        # The REST page query: this snapshot, these providers, ordered by (start, id).
        indexes = ((("snapshot", "provider", "start", "id"), False), (("snapshot", "start", "id"), False))


class ConnectorSession(BaseModel):
    """A physician's session with the EHR connector; the sync only covers active ones."""

    user = peewee.ForeignKeyField(User, backref="connector_sessions", on_delete="CASCADE")
    started_at = peewee.DateTimeField(default=wall_now)
    last_seen_at = peewee.DateTimeField(default=wall_now)
    ended_at = peewee.DateTimeField(null=True)
