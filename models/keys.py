"""Signing keys in the database, shared by every process and host (private halves encrypted)."""
from __future__ import annotations

import peewee

from models.db import BaseModel


class SigningKeyRecord(BaseModel):
    """One RSA signing key. `not_before` (epoch seconds) is when it may start signing: a rotated key
    is published in the JWKS for the JWKS cache lifetime before that moment."""

    kid = peewee.CharField(primary_key=True, max_length=64)
    created = peewee.BigIntegerField()
    not_before = peewee.BigIntegerField(index=True)
    public_jwk = peewee.TextField()          # JSON of the public JWK (never a private member)
    private_key = peewee.TextField()         # AES-GCM sealed PKCS#8 PEM, see keys.encryption

    class Meta:
        table_name = "signing_key"
