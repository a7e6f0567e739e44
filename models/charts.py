"""Chart retrieval requests: a partner asks for a patient's chart; a worker builds the ZIP."""
from __future__ import annotations

import secrets

import peewee

from models.application import Application
from models.db import BaseModel, wall_now
from models.directory import Organization

CHART_STATUSES = ("pending", "ready", "failed")


def new_request_id() -> str:
    """20 lower-case hex characters, the shape of the spec's test id a1b2c3d4e5f6a7b8c9d0."""
    return secrets.token_hex(10)


class ChartRequest(BaseModel):
    id = peewee.CharField(primary_key=True, max_length=64, default=new_request_id)
    application = peewee.ForeignKeyField(Application, on_delete="CASCADE")
    organization = peewee.ForeignKeyField(Organization, on_delete="CASCADE")
    patient_id = peewee.CharField(max_length=64)
    status = peewee.CharField(max_length=16, default="pending")
    created_at = peewee.DateTimeField(default=wall_now)
    ready_at = peewee.DateTimeField(null=True)
    error = peewee.TextField(null=True)
    object_key = peewee.CharField(max_length=300, null=True)
    attempts = peewee.IntegerField(default=0)
    # Lease of the build (workers.recovery): the Dramatiq message that may build it now, and until
    # when. A worker renews it while it builds; an expired lease of a pending request means its
    # worker died, and the sweep re-queues it.
    lease_owner = peewee.CharField(max_length=64, null=True)
    lease_until = peewee.DateTimeField(null=True)
