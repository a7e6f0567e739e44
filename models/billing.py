"""The billing ledger: one row per (application, organization, user, month) that is billable.

No foreign key (nothing a delete can cascade through, nothing a recursive delete follows): the
ledger outlives the app, the clinic and the user it names, past months and the month not yet
invoiced alike. Ids are kept as text, and what the report prints of the clinic and the user (its
name, their email) is copied into the row when the use is billed (migration 5401 made it so; NULL
in a row the release before wrote during a rolling upgrade: the report reads the current name).
"""
from __future__ import annotations

import peewee

from models.db import BaseModel, wall_now


class BillableUse(BaseModel):
    application_id = peewee.CharField(max_length=64, index=True)
    organization_id = peewee.CharField(max_length=64, index=True)
    user_id = peewee.CharField(max_length=64, index=True)
    month = peewee.CharField(max_length=7)  # YYYY-MM, UTC
    first_verified_at = peewee.DateTimeField(default=wall_now)
    organization_name = peewee.CharField(max_length=200, null=True)  # when billed
    user_email = peewee.CharField(max_length=254, null=True)  # when billed

    class Meta:
        table_name = "billable_use"
        # The unique index is what makes concurrent launches from many processes bill once.
        indexes = ((("application_id", "organization_id", "user_id", "month"), True),)
