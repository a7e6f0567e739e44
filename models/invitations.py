"""Invitations: a single-use, expiring link that lets an invited user into the sandbox hub."""
from __future__ import annotations

import peewee

from models.application import Application
from models.db import BaseModel, wall_now
from models.directory import Organization, User


class Invitation(BaseModel):
    """Stored by the keyed hash of its token: the link itself is a bearer secret."""

    token_hash = peewee.CharField(primary_key=True, max_length=128)
    application = peewee.ForeignKeyField(Application, on_delete="CASCADE")
    organization = peewee.ForeignKeyField(Organization, on_delete="CASCADE")
    user = peewee.ForeignKeyField(User, backref="invitations", on_delete="CASCADE")
    created_at = peewee.DateTimeField(default=wall_now)
    expires_at = peewee.DateTimeField()
    used_at = peewee.DateTimeField(null=True)
    key_id = peewee.CharField(max_length=16, null=True)  # which SVC_HMAC_KEY made token_hash

    def consume(self, now) -> bool:
        """Mark the invitation used at `now`; True for exactly one caller, and only before it expires."""
        claimed = (Invitation.update(used_at=now)
                   .where((Invitation.token_hash == self.token_hash) & Invitation.used_at.is_null()
                          & (Invitation.expires_at > now))
                   .execute())
        return claimed == 1
