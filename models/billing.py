"""The billing ledger: one row per (application, organization, user, month) that is billable."""
from __future__ import annotations

import peewee

from models.application import Application
from models.db import BaseModel, wall_now
from models.directory import Organization, User


class BillableUse(BaseModel):
    application = peewee.ForeignKeyField(Application, on_delete="CASCADE")
    organization = peewee.ForeignKeyField(Organization, on_delete="CASCADE")
    user = peewee.ForeignKeyField(User, on_delete="CASCADE")
    month = peewee.CharField(max_length=7)  # YYYY-MM, UTC
    first_verified_at = peewee.DateTimeField(default=wall_now)

    class Meta:
        # The unique index is what makes concurrent launches from many processes bill once.
        indexes = ((("application", "organization", "user", "month"), True),)
