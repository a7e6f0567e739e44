"""Partner developers of the console: accounts, which applications each may manage, one-time
invitations and server-side sessions. Invitation and session tokens are stored only hashed."""
from __future__ import annotations

import datetime as dt

import peewee

from models.application import Application
from models.db import BaseModel
from models.ids import new_id


class Developer(BaseModel):
    """A person at a partner. No password until they open their invitation."""

    id = peewee.CharField(primary_key=True, max_length=64, default=lambda: new_id("dev"))
    email = peewee.CharField(max_length=254, unique=True)
    password_hash = peewee.CharField(max_length=200, null=True)
    totp_secret = peewee.CharField(max_length=200, null=True)  # sealed (console.accounts.seal_totp)
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
    # The TOTP secret offered on the invitation page, sealed; kept server-side until it is confirmed.
    totp_secret = peewee.CharField(max_length=200, null=True)
    key_id = peewee.CharField(max_length=16, null=True)  # which SVC_HMAC_KEY made token_hash


def _session_cutoffs(settings, at: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """(idle since, signed in since): a session last used at or before the first, or signed in at
    or before the second, is over at `at`."""
    return (at - dt.timedelta(seconds=settings.console_idle_timeout),
            at - dt.timedelta(seconds=settings.console_session_lifetime))


class ConsoleSession(BaseModel):
    """A signed-in browser. The cookie holds the token; the row holds its hash. A session ends when
    unused for SVC_CONSOLE_IDLE_TIMEOUT, or SVC_CONSOLE_SESSION_LIFETIME after its sign-in however
    busy: `live_at` and `ended` are that one rule (sign-in, retention and `keys rekey` apply it)."""

    token_hash = peewee.CharField(primary_key=True, max_length=128)
    developer = peewee.ForeignKeyField(Developer, on_delete="CASCADE")
    created_at = peewee.DateTimeField()  # the sign-in
    last_seen_at = peewee.DateTimeField()
    key_id = peewee.CharField(max_length=16, null=True)  # which SVC_HMAC_KEY made token_hash

    @classmethod
    def live_at(cls, settings, at: dt.datetime):
        """The sessions still signed in at `at` (a Peewee condition)."""
        idle_since, signed_in_since = _session_cutoffs(settings, at)
        return (cls.last_seen_at > idle_since) & (cls.created_at > signed_in_since)

    def ended(self, settings, at: dt.datetime) -> bool:
        """Whether this session is over at `at` (the rule of `live_at`)."""
        idle_since, signed_in_since = _session_cutoffs(settings, at)
        return self.last_seen_at <= idle_since or self.created_at <= signed_in_since
