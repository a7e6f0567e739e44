"""Sandbox sign-in: one-time sign-in links and the browser sessions they open.

Both are stored by the keyed hash of their secret (the link token, the session cookie), so a
database reader cannot sign in as anyone."""
from __future__ import annotations

import peewee

from models.application import Application
from models.db import BaseModel
from models.directory import User


class SandboxSigninLink(BaseModel):
    token_hash = peewee.CharField(primary_key=True, max_length=128)
    user = peewee.ForeignKeyField(User, on_delete="CASCADE")
    application = peewee.ForeignKeyField(Application, null=True, on_delete="CASCADE")  # the deep link's app
    target = peewee.CharField(max_length=16, default="hub")  # "hub" or "settings"
    created_at = peewee.DateTimeField()
    expires_at = peewee.DateTimeField()
    used_at = peewee.DateTimeField(null=True)
    key_id = peewee.CharField(max_length=16, null=True)  # which SVC_HMAC_KEY made token_hash


class SandboxSession(BaseModel):
    session_hash = peewee.CharField(primary_key=True, max_length=128)
    user = peewee.ForeignKeyField(User, on_delete="CASCADE")
    signed_in_at = peewee.DateTimeField()
    expires_at = peewee.DateTimeField(index=True)
    ended_at = peewee.DateTimeField(null=True)
    key_id = peewee.CharField(max_length=16, null=True)  # which SVC_HMAC_KEY made session_hash
