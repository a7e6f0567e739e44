"""Private signing keys at rest: AES-256-GCM under a key derived (HKDF-SHA-256) from SVC_HMAC_KEY.

SVC_HMAC_KEY is the one secret every host already shares, so any host can read the keys another
host created, and a database dump alone reveals no private key. The key id is the associated
data: a sealed key copied onto another key's row does not open. Keys are sealed under the current
SVC_HMAC_KEY and opened under it or any of SVC_HMAC_KEY_PREVIOUS (`svc-auth keys rekey` re-seals
them under the current one).
"""
from __future__ import annotations

import base64
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from conf import ConfigError

FORMAT = "v1"
INFO = b"svc-auth signing-key encryption v1"


class KeyDecryptionError(ConfigError):
    """A stored private key does not open under this host's key-encryption key: SVC_HMAC_KEY is not
    the one the other hosts use (a configuration error: the command stops with that message)."""


def _aead(secret: bytes) -> AESGCM:
    return AESGCM(HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=INFO).derive(secret))


class KeyCipher:
    def __init__(self, secret: bytes, previous: tuple[bytes, ...] | list[bytes] = ()):
        self._aeads = tuple(_aead(k) for k in (secret, *(p for p in previous if p != secret)))

    def seal(self, kid: str, plaintext: bytes) -> str:
        nonce = os.urandom(12)
        sealed = self._aeads[0].encrypt(nonce, plaintext, kid.encode())
        return f"{FORMAT}:" + base64.b64encode(nonce + sealed).decode()

    def open_with(self, kid: str, sealed: str) -> tuple[bytes, int]:
        """(plaintext, which key opened it: 0 = SVC_HMAC_KEY, 1.. = SVC_HMAC_KEY_PREVIOUS in order)."""
        version, _, payload = sealed.partition(":")
        name = f"EHR client key {kid[4:]}" if kid.startswith("ehr:") else f"signing key {kid}"  # keys.ehr_client's
        if version != FORMAT:
            raise KeyDecryptionError(f"{name}: unknown format {version!r}")
        raw = base64.b64decode(payload)
        for index, aead in enumerate(self._aeads):
            try:
                return aead.decrypt(raw[:12], raw[12:], kid.encode()), index
            except InvalidTag:
                continue
        raise KeyDecryptionError(
            f"{name} does not decrypt: SVC_HMAC_KEY differs from the host that created it, and no key "
            "of SVC_HMAC_KEY_PREVIOUS opens it either (every host must use the same SVC_HMAC_KEY)")

    def open(self, kid: str, sealed: str) -> bytes:
        return self.open_with(kid, sealed)[0]
