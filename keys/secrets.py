"""Keyed hashing of bearer secrets (client secrets, codes), sealing of stored ones, and the server HMAC key.

Our secrets carry 256 bits of randomness, so a keyed HMAC-SHA-256 is as strong as a slow password
hash against guessing and costs microseconds instead of capping the token endpoint.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from keys.files import directory_lock, write_private


class SecretHasher:
    """HMAC-SHA-256 under the server key; compares in constant time."""

    def __init__(self, key: bytes):
        if len(key) < 32:
            raise ValueError("the HMAC key must be at least 32 bytes")
        self._key = key
        # The sealing cipher, derived once (every code exchange seals the ID token into its access token).
        self._sealer = AESGCM(hmac.new(key, b"svc-auth seal v1", hashlib.sha256).digest())

    def digest(self, secret: str) -> str:
        return hmac.new(self._key, secret.encode("utf-8"), hashlib.sha256).hexdigest()

    def matches(self, secret: str, digest: str | None) -> bool:
        if not digest or not isinstance(secret, str):
            return False
        return hmac.compare_digest(self.digest(secret), digest)

    def derive(self, label: bytes) -> bytes:
        """A key for one purpose (`label`), derived from the server key: HMAC-SHA-256(key, label)."""
        return hmac.new(self._key, label, hashlib.sha256).digest()

    def sign(self, message: str) -> str:
        """A URL-safe MAC of `message` (local object-store URLs, invitation links)."""
        mac = hmac.new(self._key, message.encode("utf-8"), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    def verify(self, message: str, signature: str) -> bool:
        return hmac.compare_digest(self.sign(message), signature or "")

    def seal(self, plaintext: str, context: str) -> str:
        """`plaintext` encrypted at rest (AES-256-GCM under a key derived from the server key), bound
        to `context` (e.g. the row's id) so a sealed value cannot be moved to another row."""
        nonce = secrets.token_bytes(12)
        sealed = self._sealer.encrypt(nonce, plaintext.encode("utf-8"), context.encode("utf-8"))
        return base64.urlsafe_b64encode(nonce + sealed).decode()

    def unseal(self, sealed: str, context: str) -> str | None:
        """What `seal` sealed for `context`, or None if it was not (tampered, other key or row)."""
        try:
            raw = base64.urlsafe_b64decode(sealed.encode())
            return self._sealer.decrypt(raw[:12], raw[12:], context.encode("utf-8")).decode("utf-8")
        except (InvalidTag, ValueError):
            return None


def load_hmac_key(configured: str, keys_dir: str) -> bytes:
    """The configured key (SVC_HMAC_KEY), else `keys_dir/hmac.key`, made once for all processes."""
    if configured:
        return configured.encode("utf-8")
    directory = Path(keys_dir)
    path = directory / "hmac.key"
    if not path.exists():
        with directory_lock(directory):
            if not path.exists():
                write_private(path, secrets.token_hex(32).encode())
    return path.read_bytes().strip()
