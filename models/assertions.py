"""Client assertions already used (RFC 7523 3: a `jti` is never accepted twice), kept until they expire.

In the database, so every `serve` process and host sees the same spent set. The key is a digest of
(client_id, jti): fixed-size whatever the client sent, and one client's jti never collides with
another's (RFC 7523: a jti is unique per issuer)."""
from __future__ import annotations

import peewee

from models.db import BaseModel


class SpentAssertion(BaseModel):
    key = peewee.CharField(primary_key=True, max_length=64)   # sha256 hex of client_id NUL jti
    expires_at = peewee.BigIntegerField(index=True)           # epoch seconds: the assertion's exp
