"""RSA signing keys: generated on first start, shared by every process through `keys_dir`.

Each key is `keys_dir/rsa-<created epoch>-<kid>.pem`; the newest signs. Older keys stay in the JWKS
until every token they could have signed has expired (`retain_seconds` after their successor was
created), then drop out. Key objects are built once per file and cached: building one from PEM on
every signature makes signing ~60x slower.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jose import jwk
from jose.backends.base import Key

from keys.files import directory_lock, write_private

ALGORITHM = "RS256"


def _b64(number: int) -> str:
    raw = number.to_bytes((number.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def thumbprint(public_numbers) -> str:
    """RFC 7638 JWK thumbprint (SHA-256) of an RSA public key: our `kid`."""
    members = {"e": _b64(public_numbers.e), "kty": "RSA", "n": _b64(public_numbers.n)}
    canonical = json.dumps(members, separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(hashlib.sha256(canonical).digest()).rstrip(b"=").decode()


@dataclass(frozen=True)
class SigningKey:
    kid: str
    created: int
    signer: Key      # python-jose key object (private), built once
    verifier: Key    # python-jose key object (public), built once
    public_jwk: dict


def _load(path: Path, created: int) -> SigningKey:
    pem = path.read_bytes()
    private = serialization.load_pem_private_key(pem, password=None)
    public = private.public_key()
    kid = thumbprint(public.public_numbers())
    public_pem = public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    nums = public.public_numbers()
    return SigningKey(
        kid=kid, created=created,
        signer=jwk.construct(pem.decode(), ALGORITHM),
        verifier=jwk.construct(public_pem.decode(), ALGORITHM),
        public_jwk={"kty": "RSA", "use": "sig", "alg": ALGORITHM, "kid": kid,
                    "n": _b64(nums.n), "e": _b64(nums.e)},
    )


def generate_key_file(directory: Path, created: int | None = None) -> Path:
    """Write a new RSA-2048 key; it becomes the active signing key of every process."""
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    kid = thumbprint(private.public_key().public_numbers())
    created = int(created if created is not None else time.time())
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    path = directory / f"rsa-{created:012d}-{kid}.pem"
    write_private(path, pem)
    return path


class KeyRing:
    """The signing keys of this deployment, reloaded when another process rotates them."""

    RECHECK_SECONDS = 1.0

    def __init__(self, keys_dir: str, retain_seconds: int, clock=time.time):
        self.directory = Path(keys_dir)
        self.retain_seconds = retain_seconds
        self._clock = clock
        self._cache: dict[str, SigningKey] = {}
        self._keys: list[SigningKey] = []
        self._checked_at = 0.0
        self._mtime = None
        self.ensure()

    def ensure(self) -> None:
        """Generate the first key if the directory has none (once, even with many processes)."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not list(self.directory.glob("rsa-*.pem")):
            with directory_lock(self.directory):
                if not list(self.directory.glob("rsa-*.pem")):
                    generate_key_file(self.directory, created=int(self._clock()))
        self._reload()

    def rotate(self) -> SigningKey:
        """Add a new active key; the previous ones stay published until their tokens expire."""
        with directory_lock(self.directory):
            newest = max((k.created for k in self._scan()), default=0)
            generate_key_file(self.directory, created=max(int(self._clock()), newest + 1))
            self._reload()
            self._prune_files()
        self._reload()
        return self.active

    def _scan(self) -> list[SigningKey]:
        keys = []
        for path in sorted(self.directory.glob("rsa-*.pem")):
            created = int(path.name.split("-")[1])
            key = self._cache.get(path.name)
            if key is None:
                key = self._cache[path.name] = _load(path, created)
            keys.append(key)
        return keys

    def _reload(self) -> None:
        self._mtime = os.stat(self.directory).st_mtime_ns
        self._checked_at = time.monotonic()
        self._keys = sorted(self._scan(), key=lambda k: k.created)

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._checked_at < self.RECHECK_SECONDS:
            return
        self._checked_at = now
        if os.stat(self.directory).st_mtime_ns != self._mtime:
            self._reload()

    def _published(self) -> list[SigningKey]:
        """Active key plus older keys whose successor is younger than `retain_seconds`."""
        keys = self._keys
        now = self._clock()
        return [k for i, k in enumerate(keys)
                if i == len(keys) - 1 or now - keys[i + 1].created < self.retain_seconds]

    def _prune_files(self) -> None:
        keep = {k.kid for k in self._published()}
        for path in self.directory.glob("rsa-*.pem"):
            if path.stem.split("-", 2)[2] not in keep:
                path.unlink(missing_ok=True)
                self._cache.pop(path.name, None)

    @property
    def active(self) -> SigningKey:
        self._refresh()
        return self._keys[-1]

    def verifier(self, kid: str) -> Key | None:
        """The public key object for `kid`, if it is still published."""
        self._refresh()
        for key in self._published():
            if key.kid == kid:
                return key.verifier
        return None

    def jwks(self) -> dict:
        self._refresh()
        return {"keys": [k.public_jwk for k in reversed(self._published())]}
