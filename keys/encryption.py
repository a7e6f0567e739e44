"""Private signing keys at rest: AES-256-GCM under a key derived (HKDF-SHA-256) from SVC_HMAC_KEY.

SVC_HMAC_KEY is the one secret every host already shares, so any host can read the keys another
host created, and a database dump alone reveals no private key. The key id is the associated
data: a sealed key copied onto another key's row does not open.
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


class KeyCipher:
    def __init__(self, secret: bytes):
        key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=INFO).derive(secret)
        self._aead = AESGCM(key)

    def seal(self, kid: str, plaintext: bytes) -> str:
        nonce = os.urandom(12)
        sealed = self._aead.encrypt(nonce, plaintext, kid.encode())
        return f"{FORMAT}:" + base64.b64encode(nonce + sealed).decode()

    def open(self, kid: str, sealed: str) -> bytes:
        version, _, payload = sealed.partition(":")
        if version != FORMAT:
            raise KeyDecryptionError(f"signing key {kid}: unknown format {version!r}")
        raw = base64.b64decode(payload)
        try:
            return self._aead.decrypt(raw[:12], raw[12:], kid.encode())
        except InvalidTag:
            raise KeyDecryptionError(
                f"signing key {kid} does not decrypt: SVC_HMAC_KEY differs from the host that created it "
                "(every host must use the same SVC_HMAC_KEY)") from None
