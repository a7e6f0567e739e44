"""Partner developers of the console: accounts, which applications each may manage, one-time
invitations and server-side sessions. Invitation and session tokens are stored only hashed."""
from __future__ import annotations

import peewee

from models.application import Application
from models.db import BaseModel
from models.ids import new_id


class Developer(BaseModel):
    """A person at a partner. No password until they open their invitation."""

    id = peewee.CharField(primary_key=True, max_length=64, default=lambda: new_id("dev"))
    email = peewee.CharField(max_length=254, unique=True)
    password_hash = peewee.CharField(max_length=200, null=True)
    totp_secret = peewee.CharField(max_length=64, null=True)
    # The time step of the last authenticator code accepted: a code is good once (RFC 6238 5.2).
    totp_last_step = peewee.BigIntegerField(null=True)
    created_at = peewee.DateTimeField()
    activated_at = peewee.DateTimeField(null=True)


class DeveloperAccess(BaseModel):
    """A developer may see and change this application (granted by an operator's invitation)."""

    developer = peewee.ForeignKeyField(Developer, backref="access", on_delete="CASCADE")
    application = peewee.ForeignKeyField(Application, on_delete="CASCADE")
    granted_at = peewee.DateTimeField()

    class Meta:
        indexes = ((("developer", "application"), True),)


class DeveloperInvite(BaseModel):
    """A one-time link to set a password (and optionally a TOTP factor)."""

    token_hash = peewee.CharField(primary_key=True, max_length=128)
    developer = peewee.ForeignKeyField(Developer, on_delete="CASCADE")
    application = peewee.ForeignKeyField(Application, on_delete="CASCADE")
    created_at = peewee.DateTimeField()
    expires_at = peewee.DateTimeField()
    used_at = peewee.DateTimeField(null=True)
    # The TOTP secret offered on the invitation page; kept server-side until it is confirmed.
    totp_secret = peewee.CharField(max_length=64, null=True)
    key_id = peewee.CharField(max_length=16, null=True)  # which SVC_HMAC_KEY made token_hash


class ConsoleSession(BaseModel):
    """A signed-in browser. The cookie holds the token; the row holds its hash."""

    token_hash = peewee.CharField(primary_key=True, max_length=128)
    developer = peewee.ForeignKeyField(Developer, on_delete="CASCADE")
    created_at = peewee.DateTimeField()
    last_seen_at = peewee.DateTimeField()
    key_id = peewee.CharField(max_length=16, null=True)  # which SVC_HMAC_KEY made token_hash
