"""One-time artefacts of the launch flow (launches, authorization codes) and issued tokens."""
from __future__ import annotations

import datetime as dt

import peewee

from models.application import Application, Installation
from models.db import BaseModel, wall_now
from models.directory import Organization, User
from models.prepared import PreparedInsert, PreparedQuery


class Launch(BaseModel):
    """A launch identifier the host platform minted for one user opening one app."""

    id = peewee.CharField(primary_key=True, max_length=64)
    application = peewee.ForeignKeyField(Application, on_delete="CASCADE")
    user = peewee.ForeignKeyField(User, on_delete="CASCADE")
    organization = peewee.ForeignKeyField(Organization, on_delete="CASCADE")
    created_at = peewee.DateTimeField(default=wall_now)
    expires_at = peewee.DateTimeField()
    used_at = peewee.DateTimeField(null=True)

    def consume(self, now: dt.datetime) -> bool:
        """Mark the launch used at `now`; True for exactly one caller (the database decides)."""
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
    created_at = peewee.DateTimeField(default=wall_now)
    expires_at = peewee.DateTimeField()
    used_at = peewee.DateTimeField(null=True)

    @classmethod
    def find_for_exchange(cls, code_hash: str) -> "AuthorizationCode | None":
        """The code with its `user` and `installation` (of its app in its organization, or None)
        read in one query: what a code exchange needs."""
        return _CODE_FOR_EXCHANGE.first(code_hash)

    @property
    def installation(self) -> "Installation | None":
        """The installation of the code's application in its organization (None if uninstalled)."""
        if "_installation" not in self.__dict__:
            self._installation = Installation.find(self.application_id, self.organization_id)
        return self._installation

    @installation.setter
    def installation(self, value: "Installation | None") -> None:
        self._installation = value

    def consume(self, now: dt.datetime) -> bool:
        """Mark the code used at `now`; True for exactly one concurrent caller."""
        return _CONSUME_CODE.execute(self.code_hash, now) == 1

    def expired(self, now: dt.datetime) -> bool:
        return self.expires_at <= now


class IssuedToken(BaseModel):
    """Every access token we sign, by `jti`, so it can be revoked before it expires."""

    jti = peewee.CharField(primary_key=True, max_length=64)
    kind = peewee.CharField(max_length=16)  # "access" (user) or "client" (client credentials)
    application = peewee.ForeignKeyField(Application, on_delete="CASCADE")
    user = peewee.ForeignKeyField(User, null=True, on_delete="CASCADE")
    code_hash = peewee.CharField(max_length=128, null=True, index=True)
    issued_at = peewee.DateTimeField(default=wall_now)
    expires_at = peewee.DateTimeField(index=True)
    revoked_at = peewee.DateTimeField(null=True)

    @classmethod
    def record(cls, **values) -> None:
        """Insert the row of a token just signed (same columns and defaults as `create`, less CPU)."""
        _INSERT_ISSUED_TOKEN.insert(**values)

    @classmethod
    def revoke_from_code(cls, code_hash: str, now: dt.datetime) -> int:
        return (cls.update(revoked_at=now)
                .where((cls.code_hash == code_hash) & cls.revoked_at.is_null()).execute())

    @classmethod
    def is_active(cls, jti: str, now: dt.datetime) -> bool:
        row = _ISSUED_TOKEN_BY_JTI.first(jti) if isinstance(jti, str) else None
        return row is not None and row.revoked_at is None and row.expires_at > now


_CODE_FOR_EXCHANGE = PreparedQuery(
    lambda code_hash: (
        AuthorizationCode.select(AuthorizationCode, User, Installation)
        .join(User)
        .switch(AuthorizationCode)
        .join(Installation, peewee.JOIN.LEFT_OUTER, attr="installation",
              on=((Installation.application == AuthorizationCode.application)
                  & (Installation.organization == AuthorizationCode.organization)))
        .where(AuthorizationCode.code_hash == code_hash)),
    AuthorizationCode.code_hash, attach={User: "user", Installation: "installation"})
_CONSUME_CODE = PreparedQuery(
    lambda code_hash, now: (AuthorizationCode.update(used_at=now)
                            .where((AuthorizationCode.code_hash == code_hash) & AuthorizationCode.used_at.is_null())),
    AuthorizationCode.code_hash, AuthorizationCode.used_at)
_INSERT_ISSUED_TOKEN = PreparedInsert(IssuedToken)
_ISSUED_TOKEN_BY_JTI = PreparedQuery(
    lambda jti: IssuedToken.select().where(IssuedToken.jti == jti).limit(1), IssuedToken.jti)


def expiry(now: dt.datetime, seconds: int) -> dt.datetime:
    return now + dt.timedelta(seconds=seconds)
