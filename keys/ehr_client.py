"""svc-auth's client keys for EHRs: what its SMART Backend Services assertions are signed with.

RSA keys, the first created on first use, stored sealed (AES-256-GCM, the signing keys' cipher), so
every process and host signs with the same key and publishes the same JWKS
(`{SVC_ISSUER}/ehr/jwks.json`). Assertions are RS384, as SMART Backend Services requires.

`svc-auth ehr rotate-key` (lifecycle.ehr_keys) adds a key: the newest key signs every assertion from
then on. Nothing caches a key: `current()` reads the newest row each time svc-auth asks an EHR for
a token (once per token lifetime per EHR), so every process on every host signs with the new key
from its next token on, with no announcement. Older keys stay published for
SVC_EHR_KEY_OVERLAP_SECONDS after their successor was created (EHRs cache the JWKS, and tokens are
asked with the previous key while an EHR's cached copy lacks the new one: `signing_keys()`); after
that their rows, private halves included, are deleted by the first reader that sees them
(`prune`), or at once by `ehr rotate-key --finish`.
"""
from __future__ import annotations

import json
import time

from cryptography.hazmat.primitives import serialization

from keys.encryption import KeyCipher
from keys.signing import new_private_pem, public_jwk_of
from models.audit import AuditEvent
from models.ehr import EhrClientKey

ALGORITHM = "RS384"
AAD_PREFIX = "ehr:"  # sealed under the same cipher as signing keys, in a domain of its own
DEFAULT_OVERLAP_SECONDS = 24 * 3600


class EhrClientKeys:
    """The keys an EHR knows svc-auth by (shared through the database, newest first)."""

    def __init__(self, cipher: KeyCipher, overlap_seconds: int = DEFAULT_OVERLAP_SECONDS, clock=time.time):
        self.cipher = cipher
        self.overlap_seconds = overlap_seconds
        self._clock = clock

    # -- reading -------------------------------------------------------------------------------
    def _rows(self) -> list:
        """Every stored key, newest first (`created` is strictly increasing: `add`)."""
        return list(EhrClientKey.select().order_by(EhrClientKey.created.desc(), EhrClientKey.kid))

    def _published(self, rows: list, now: float) -> list:
        """The newest key, and older keys whose successor was created less than the overlap ago."""
        return [row for i, row in enumerate(rows) if i == 0 or now - rows[i - 1].created < self.overlap_seconds]

    def _live_rows(self) -> list:
        rows = self._rows()
        if not rows:
            self.add()
            rows = self._rows()
        published = self._published(rows, self._clock())
        if len(published) < len(rows):
            self.prune(rows[len(published):], reason="overlap over")
        return published

    def current(self) -> tuple[str, bytes]:
        """(kid, private PEM) of the newest key, creating the first one."""
        row = self._live_rows()[0]
        return row.kid, self.cipher.open(AAD_PREFIX + row.kid, row.private_key)

    def signing_keys(self) -> list[tuple[str, bytes]]:
        """(kid, private PEM) of every published key, newest first: the newest signs; an older one
        only when an EHR refuses the newest during the overlap (its cached JWKS predates it)."""
        return [(row.kid, self.cipher.open(AAD_PREFIX + row.kid, row.private_key)) for row in self._live_rows()]

    def require_open(self) -> None:
        """Open every stored key (`serve`'s start, as the signing keys): KeyDecryptionError, one
        line naming SVC_HMAC_KEY, for one no configured key opens (else every token svc-auth asks
        an EHR for would fail)."""
        for row in self._rows():
            self.cipher.open(AAD_PREFIX + row.kid, row.private_key)

    def jwks(self) -> dict:
        """Every published key's public half (the document EHRs fetch as svc-auth's `jwks_uri`)."""
        return {"keys": [json.loads(row.public_jwk) for row in self._live_rows()]}

    def created(self, kid: str) -> int:
        """When this key was created (epoch seconds): its predecessor stays published for the
        overlap after it."""
        return EhrClientKey.get(EhrClientKey.kid == kid).created

    def kids(self) -> list[str]:
        """Every stored key's kid, newest first (published or not yet pruned)."""
        return [row.kid for row in self._rows()]

    # -- changing ------------------------------------------------------------------------------
    def add(self) -> str:
        """A new key, newer than every stored one: it signs from now on. Returns its kid."""
        pem = new_private_pem()
        public = self._public_jwk(pem)
        newest = EhrClientKey.select(EhrClientKey.created).order_by(EhrClientKey.created.desc()).first()
        created = max(int(self._clock()), newest.created + 1 if newest else 0)
        EhrClientKey.insert(kid=public["kid"], created=created, public_jwk=json.dumps(public, sort_keys=True),
                            private_key=self.cipher.seal(AAD_PREFIX + public["kid"], pem)).on_conflict_ignore().execute()
        return public["kid"]

    def prune(self, rows: list, reason: str, actor: str = "system") -> list[str]:
        """Delete these keys (public and private halves); the kids this call deleted, each audited
        once whichever process deleted it."""
        dropped = []
        for row in rows:
            if EhrClientKey.delete().where(EhrClientKey.kid == row.kid).execute():
                AuditEvent.record(actor, "ehr.key_dropped", row.kid, reason=reason, created=row.created)
                dropped.append(row.kid)
        return dropped

    def drop_all_but_newest(self, actor: str = "operator") -> list[str]:
        """End the overlap now: every key but the newest is deleted."""
        return self.prune(self._rows()[1:], reason="rotate-key --finish", actor=actor)

    def expired(self) -> list:
        """Stored keys whose overlap is over (left to delete)."""
        rows = self._rows()
        return rows[len(self._published(rows, self._clock())):]

    @staticmethod
    def _public_jwk(pem: bytes) -> dict:
        return {**public_jwk_of(serialization.load_pem_private_key(pem, password=None)), "alg": ALGORITHM}
