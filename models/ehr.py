"""svc-auth's own client keys for EHRs (SMART Backend Services), sealed like the signing keys."""
from __future__ import annotations

import peewee

from models.db import BaseModel


class EhrClientKey(BaseModel):
    """An RSA key svc-auth signs its `private_key_jwt` client assertions with. The public half is
    published at `{SVC_ISSUER}/ehr/jwks.json`, which EHRs are given as svc-auth's `jwks_uri`."""

    kid = peewee.CharField(primary_key=True, max_length=64)
    created = peewee.BigIntegerField()
    public_jwk = peewee.TextField()          # JSON of the public JWK (never a private member)
    private_key = peewee.TextField()         # AES-GCM sealed PKCS#8 PEM, see keys.encryption

    class Meta:
        table_name = "ehr_client_key"
