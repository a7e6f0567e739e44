"""Keyed hashing of bearer secrets (client secrets, codes), sealing of stored ones, and the server HMAC key.

Our secrets carry 256 bits of randomness, so a keyed HMAC-SHA-256 is as strong as a slow password
hash against guessing and costs microseconds instead of capping the token endpoint.

Rotation (SVC_HMAC_KEY_PREVIOUS, docs/operations.md): everything is made with the current key and
checked against the current key, then each previous key, so what an old key made keeps working
until the operator retires it. Every compare is constant-time and, for one value, every key is
tried whatever the outcome.
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

KEY_ID_LABEL = b"svc-auth key id v1"


def key_id(key: bytes) -> str:
    """A short public name of a key (stored beside what it made): HMAC-SHA-256(key, label), 16 hex digits."""
    return hmac.new(key, KEY_ID_LABEL, hashlib.sha256).hexdigest()[:16]


def _hexdigest(keyed, data: bytes) -> str:
    """HMAC-SHA-256 of `data` under the key `keyed` (an HMAC object holding only its key), in hex."""
    mac = keyed.copy()
    mac.update(data)
    return mac.hexdigest()


class SecretHasher:
    """HMAC-SHA-256 under the server key (and, for checks, the previous ones); compares in constant time."""

    def __init__(self, key: bytes, previous: tuple[bytes, ...] | list[bytes] = ()):
        for one in (key, *previous):
            if len(one) < 32:
                raise ValueError("the HMAC key must be at least 32 bytes")
        self._key = key
        self._keys = (key, *(k for k in previous if k != key))
        self.key_id = key_id(key)
        self.key_ids = tuple(key_id(k) for k in self._keys)  # the current key's, then the previous keys'
        # Each key's HMAC keyed once: a hash copies it (about 1 µs) instead of keying it anew (about 2.7).
        self._macs = tuple(hmac.new(k, digestmod=hashlib.sha256) for k in self._keys)
        # The sealing ciphers, derived once (every code exchange seals the ID token into its access token).
        self._sealers = tuple(AESGCM(hmac.new(k, b"svc-auth seal v1", hashlib.sha256).digest()) for k in self._keys)

    @property
    def rotating(self) -> bool:
        """True when previous keys are configured (SVC_HMAC_KEY_PREVIOUS)."""
        return len(self._keys) > 1

    def digest(self, secret: str) -> str:
        """The keyed hash to store, under the current key."""
        return _hexdigest(self._macs[0], secret.encode("utf-8"))

    def digests(self, secret: str) -> list[str]:
        """The keyed hash of `secret` under every key, current first: what a stored hash may be
        (look a row up with `.in_(hasher.digests(token))`)."""
        data = secret.encode("utf-8")
        return [_hexdigest(mac, data) for mac in self._macs]

    def match(self, secret: str, digest: str | None) -> int | None:
        """Which key (0 = current) made `digest` from `secret`, or None. Every key is compared."""
        found = None
        for index, candidate in enumerate(self.digests(secret)):
            if hmac.compare_digest(candidate, digest or "") and found is None:
                found = index
        return found

    def matches(self, secret: str, digest: str | None) -> bool:
        if not digest or not isinstance(secret, str):
            return False
        return self.match(secret, digest) is not None

    def derive(self, label: bytes) -> bytes:
        """A key for one purpose (`label`), derived from the server key: HMAC-SHA-256(key, label)."""
        return hmac.new(self._key, label, hashlib.sha256).digest()

    def derive_all(self, label: bytes) -> list[bytes]:
        """`derive(label)` under every key, current first (to check what an earlier key made)."""
        return [hmac.new(k, label, hashlib.sha256).digest() for k in self._keys]

    def _mac(self, key: bytes, message: str) -> str:
        mac = hmac.new(key, message.encode("utf-8"), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    def sign(self, message: str) -> str:
        """A URL-safe MAC of `message` (local object-store URLs, invitation links)."""
        return self._mac(self._key, message)

    def verify(self, message: str, signature: str) -> bool:
        """True when any key (current, then previous) signed `message`. `signature` is whatever a
        caller sent: compared as UTF-8 bytes (`compare_digest` raises on non-ASCII text)."""
        presented = (signature or "").encode("utf-8", "surrogatepass")
        ok = False
        for key in self._keys:
            ok |= hmac.compare_digest(self._mac(key, message).encode("ascii"), presented)
        return ok

    def seal(self, plaintext: str, context: str) -> str:
        """`plaintext` encrypted at rest (AES-256-GCM under a key derived from the server key), bound
        to `context` (e.g. the row's id) so a sealed value cannot be moved to another row."""
        nonce = secrets.token_bytes(12)
        sealed = self._sealers[0].encrypt(nonce, plaintext.encode("utf-8"), context.encode("utf-8"))
        return base64.urlsafe_b64encode(nonce + sealed).decode()

    def unseal(self, sealed: str, context: str) -> str | None:
        """What `seal` sealed for `context` under any key, or None if it was not (tampered, other key or row)."""
        opened = self.unseal_with(sealed, context)
        return opened[0] if opened is not None else None

    def unseal_with(self, sealed: str, context: str) -> tuple[str, int] | None:
        """(`unseal`'s plaintext, which key opened it: 0 = the current one), or None."""
        try:
            raw = base64.urlsafe_b64decode(sealed.encode())
        except ValueError:
            return None
        for index, sealer in enumerate(self._sealers):
            try:
                return sealer.decrypt(raw[:12], raw[12:], context.encode("utf-8")).decode("utf-8"), index
            except (InvalidTag, ValueError):
                continue
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


def previous_hmac_keys(configured: tuple[str, ...]) -> tuple[bytes, ...]:
    """SVC_HMAC_KEY_PREVIOUS as keys, in the order given."""
    return tuple(k.encode("utf-8") for k in configured)
