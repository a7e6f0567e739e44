"""One-time artefacts of the launch flow (launches, authorization codes) and issued tokens."""
from __future__ import annotations

import datetime as dt

import peewee

from models.application import Application
from models.clock import clock
from models.db import BaseModel
from models.directory import Organization, User


class Launch(BaseModel):
    """A launch identifier the host platform minted for one user opening one app."""

    id = peewee.CharField(primary_key=True, max_length=64)
    application = peewee.ForeignKeyField(Application, on_delete="CASCADE")
    user = peewee.ForeignKeyField(User, on_delete="CASCADE")
    organization = peewee.ForeignKeyField(Organization, on_delete="CASCADE")
    created_at = peewee.DateTimeField(default=lambda: clock.now())
    expires_at = peewee.DateTimeField()
    used_at = peewee.DateTimeField(null=True)

    def consume(self) -> bool:
        """Mark the launch used; True for exactly one caller (the database decides)."""
        now = clock.now()
        claimed = (Launch.update(used_at=now)
                   .where((Launch.id == self.id) & Launch.used_at.is_null() & (Launch.expires_at > now))
                   .execute())
        return claimed == 1


class AuthorizationCode(BaseModel):
    """An authorization code, stored by hash; bound to client, redirect_uri, user and launch."""

    code_hash = peewee.CharField(primary_key=True, max_length=128)
    application = peewee.ForeignKeyField(Application, on_delete="CASCADE")
    user = peewee.ForeignKeyField(User, on_delete="CASCADE")
    organization = peewee.ForeignKeyField(Organization, on_delete="CASCADE")
    launch = peewee.ForeignKeyField(Launch, null=True, on_delete="SET NULL")
    redirect_uri = peewee.CharField(max_length=1000)
    nonce = peewee.CharField(max_length=500, null=True)
    created_at = peewee.DateTimeField(default=lambda: clock.now())
    expires_at = peewee.DateTimeField()
    used_at = peewee.DateTimeField(null=True)

    def consume(self) -> bool:
        """Mark the code used; True for exactly one concurrent caller."""
        claimed = (AuthorizationCode.update(used_at=clock.now())
                   .where((AuthorizationCode.code_hash == self.code_hash) & AuthorizationCode.used_at.is_null())
                   .execute())
        return claimed == 1

    @property
    def expired(self) -> bool:
        return self.expires_at <= clock.now()


class IssuedToken(BaseModel):
    """Every access token we sign, by `jti`, so it can be revoked before it expires."""

    jti = peewee.CharField(primary_key=True, max_length=64)
    kind = peewee.CharField(max_length=16)  # "access" (user) or "client" (client credentials)
    application = peewee.ForeignKeyField(Application, on_delete="CASCADE")
    user = peewee.ForeignKeyField(User, null=True, on_delete="CASCADE")
    code_hash = peewee.CharField(max_length=128, null=True, index=True)
    issued_at = peewee.DateTimeField(default=lambda: clock.now())
    expires_at = peewee.DateTimeField(index=True)
    revoked_at = peewee.DateTimeField(null=True)

    @classmethod
    def revoke_from_code(cls, code_hash: str) -> int:
        return (cls.update(revoked_at=clock.now())
                .where((cls.code_hash == code_hash) & cls.revoked_at.is_null()).execute())

    @classmethod
    def is_active(cls, jti: str) -> bool:
        row = cls.get_or_none(cls.jti == jti)
        return row is not None and row.revoked_at is None and row.expires_at > clock.now()


def expiry(seconds: int) -> dt.datetime:
    return clock.now() + dt.timedelta(seconds=seconds)
