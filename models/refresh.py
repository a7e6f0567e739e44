"""SMART refresh tokens: a grant (one authorization of one app by one user in one clinic, with the
launch context it started with) and its refresh tokens, one row per token, stored by keyed hash.

A grant's tokens form one family: each use spends a token and adds the next one (rotation), and
each row notes the jti of the access token issued with it, so every access token of a grant (and
every disclosure record that names that jti) leads back to the grant and its launch."""
from __future__ import annotations

import peewee

from models.application import Application, Installation
from models.db import BaseModel, JSONText, wall_now
from models.directory import Organization, User
from models.ids import new_id

ACCESS_KINDS = ("online", "offline")


class SmartGrant(BaseModel):
    """What a launch's code exchange granted with `offline_access` or `online_access`."""

    id = peewee.CharField(primary_key=True, max_length=64, default=lambda: new_id("grt"))
    application = peewee.ForeignKeyField(Application, on_delete="CASCADE")
    client_id = peewee.CharField(max_length=64)
    user = peewee.ForeignKeyField(User, on_delete="CASCADE")
    organization = peewee.ForeignKeyField(Organization, on_delete="CASCADE")
    # Removing the installation ends the grant with it.
    installation = peewee.ForeignKeyField(Installation, null=True, on_delete="CASCADE")
    launch_id = peewee.CharField(max_length=64, null=True)  # the launch that started it (no FK: launches are pruned)
    scope = peewee.TextField()  # the code's granted scope; a refresh may narrow it per access token, never widen it
    access = peewee.CharField(max_length=8)  # online | offline
    # The launch context of the first token response: patient, fhirUser, need_patient_banner, ...
    context = JSONText(default=dict)
    auth_time = peewee.BigIntegerField(null=True)
    # online_access: the hub session (its keyed hash) the launch came from; the grant ends with it.
    session_hash = peewee.CharField(max_length=128, null=True)
    created_at = peewee.DateTimeField(default=wall_now)
    expires_at = peewee.DateTimeField(index=True)
    revoked_at = peewee.DateTimeField(null=True)
    revoked_reason = peewee.CharField(max_length=64, null=True)


class RefreshToken(BaseModel):
    """One refresh token of a grant, by the keyed hash of its value (the value is never stored)."""

    token_hash = peewee.CharField(primary_key=True, max_length=128)
    grant = peewee.ForeignKeyField(SmartGrant, backref="tokens", on_delete="CASCADE")
    # The access token issued with this refresh token (its jti): a revocation denies the live ones,
    # and an auditor maps a disclosure record's jti to the grant and its launch.
    access_jti = peewee.CharField(max_length=64, index=True)
    created_at = peewee.DateTimeField(default=wall_now)
    spent_at = peewee.DateTimeField(null=True)
    key_id = peewee.CharField(max_length=16, null=True)  # which SVC_HMAC_KEY made token_hash (keys.secrets.key_id)
