"""Revoked access tokens by `jti`, until they would have expired anyway (the database deny-list)."""
from __future__ import annotations

import peewee

from models.db import BaseModel


class DeniedToken(BaseModel):
    jti = peewee.CharField(primary_key=True, max_length=64)
    expires_at = peewee.BigIntegerField(index=True)  # epoch seconds; the row is useless afterwards
