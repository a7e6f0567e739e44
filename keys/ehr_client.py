"""svc-auth's client keys for EHRs: what its SMART Backend Services assertions are signed with.

One RSA key, created on first use and stored sealed (AES-256-GCM, the signing keys' cipher), so
every process and host signs with the same key and publishes the same JWKS
(`{SVC_ISSUER}/ehr/jwks.json`). Assertions are RS384, as SMART Backend Services requires.
"""
from __future__ import annotations

import json
import time

from cryptography.hazmat.primitives import serialization

from keys.encryption import KeyCipher
from keys.signing import new_private_pem, public_jwk_of
from models.ehr import EhrClientKey

ALGORITHM = "RS384"
AAD_PREFIX = "ehr:"  # sealed under the same cipher as signing keys, in a domain of its own


class EhrClientKeys:
    """The key an EHR knows svc-auth by (created once, shared through the database)."""

    def __init__(self, cipher: KeyCipher):
        self.cipher = cipher

    def current(self) -> tuple[str, bytes]:
        """(kid, private PEM) of the newest key, creating the first one."""
        row = EhrClientKey.select().order_by(EhrClientKey.created.desc()).first()
        if row is None:
            pem = new_private_pem()
            public = self._public_jwk(pem)
            EhrClientKey.insert(kid=public["kid"], created=int(time.time()), public_jwk=json.dumps(public, sort_keys=True),
                                private_key=self.cipher.seal(AAD_PREFIX + public["kid"], pem)).on_conflict_ignore().execute()
            row = EhrClientKey.select().order_by(EhrClientKey.created.desc()).first()
        return row.kid, self.cipher.open(AAD_PREFIX + row.kid, row.private_key)

    def jwks(self) -> dict:
        """Every key's public half (the document EHRs fetch as svc-auth's `jwks_uri`)."""
        rows = list(EhrClientKey.select().order_by(EhrClientKey.created.desc()))
        if not rows:
            self.current()
            rows = list(EhrClientKey.select())
        return {"keys": [json.loads(row.public_jwk) for row in rows]}

    @staticmethod
    def _public_jwk(pem: bytes) -> dict:
        return {**public_jwk_of(serialization.load_pem_private_key(pem, password=None)), "alg": ALGORITHM}
