"""RSA signing keys, stored in the database and shared by every process and host.

A key row holds the public JWK and the private key sealed under SVC_HMAC_KEY (`keys.encryption`).
A key signs from its `not_before` on. A rotated key gets `not_before` = now + the pre-publication
time, so it is in the JWKS (and in every relying party's cached copy of it) before it signs
anything. An older key stays published until every token it could have signed has expired:
`retain_seconds` after its successor started signing. Key objects are built once per key and
cached; every process reloads the set when told the keys changed (`app_cache.changes`), never on
the request path.
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import peewee
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jose import jwk
from jose.backends.base import Key

from keys.encryption import KeyCipher
from models.keys import SigningKeyRecord

ALGORITHM = "RS256"
TOPIC = "signing_keys"
ADVISORY_LOCK = 0x5F6B657973  # PostgreSQL advisory lock id of "create the first key" and of a rotation

log = logging.getLogger("svc_auth.keys")


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
    not_before: int
    signer: Key      # python-jose key object (private), built once
    verifier: Key    # python-jose key object (public), built once
    public_jwk: dict
    private: rsa.RSAPrivateKey  # the same private key as a `cryptography` object: what signs tokens


def public_jwk_of(private) -> dict:
    nums = private.public_key().public_numbers()
    return {"kty": "RSA", "use": "sig", "alg": ALGORITHM, "kid": thumbprint(nums),
            "n": _b64(nums.n), "e": _b64(nums.e)}


def new_private_pem() -> bytes:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())


def generate_key_file(directory: Path, created: int | None = None) -> Path:
    """A key file in the pre-database layout (`rsa-<created>-<kid>.pem`): what `import_key_files`
    migrates. Tests use it to share one generated key across a session."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    pem = new_private_pem()
    kid = public_jwk_of(serialization.load_pem_private_key(pem, password=None))["kid"]
    path = directory / f"rsa-{int(created if created is not None else time.time()):012d}-{kid}.pem"
    from keys.files import write_private
    write_private(path, pem)
    return path


@contextlib.contextmanager
def _exclusive(db: peewee.Database):
    """A transaction no other process runs at the same time (creating the first key once, a rotation)."""
    if isinstance(db, peewee.PostgresqlDatabase):
        with db.atomic():
            db.execute_sql("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK,))
            yield
    else:
        with db.atomic(lock_type="IMMEDIATE"):
            yield


class KeyRing:
    """The deployment's signing keys, as this process knows them (loaded lazily, then on change)."""

    def __init__(self, db: peewee.Database, cipher: KeyCipher, retain_seconds: int, prepublish_seconds: int,
                 clock=time.time, legacy_dir: str | None = None):
        self.db = db
        self.cipher = cipher
        self.retain_seconds = retain_seconds
        self.prepublish_seconds = prepublish_seconds
        self._clock = clock
        self.legacy_dir = Path(legacy_dir) if legacy_dir else None
        self._built: dict[str, SigningKey] = {}
        self._keys: tuple[SigningKey, ...] = ()
        self._lock = threading.Lock()

    # -- loading -------------------------------------------------------------------------------
    def _build(self, row) -> SigningKey:
        key = self._built.get(row.kid)
        if key is None:
            pem = self.cipher.open(row.kid, row.private_key)
            public = json.loads(row.public_jwk)
            key = SigningKey(kid=row.kid, created=row.created, not_before=row.not_before,
                             signer=jwk.construct(pem.decode(), ALGORITHM),
                             verifier=jwk.construct(public, ALGORITHM), public_jwk=public,
                             private=serialization.load_pem_private_key(pem, password=None))
            self._built[row.kid] = key
        return key

    def load(self) -> None:
        """Read the key set from the database (creating or migrating the first key if there is none)."""
        rows = list(SigningKeyRecord.select().order_by(SigningKeyRecord.not_before, SigningKeyRecord.created))
        if not rows:
            self._create_first()
            rows = list(SigningKeyRecord.select().order_by(SigningKeyRecord.not_before, SigningKeyRecord.created))
        keys = tuple(self._build(row) for row in rows)
        live = {k.kid for k in keys}
        self._built = {kid: key for kid, key in self._built.items() if kid in live}
        self._keys = keys

    def _loaded(self) -> tuple[SigningKey, ...]:
        if not self._keys:
            with self._lock:
                if not self._keys:
                    self.load()
        return self._keys

    def _insert(self, pem: bytes, created: int, not_before: int) -> str:
        public = public_jwk_of(serialization.load_pem_private_key(pem, password=None))
        SigningKeyRecord.insert(kid=public["kid"], created=created, not_before=not_before,
                                public_jwk=json.dumps(public, sort_keys=True),
                                private_key=self.cipher.seal(public["kid"], pem)).on_conflict_ignore().execute()
        return public["kid"]

    def _create_first(self) -> None:
        """Once per deployment: import the key files of SVC_KEYS_DIR if any (the pre-database
        layout), else generate a key that signs at once (no relying party can have cached a JWKS)."""
        with _exclusive(self.db):
            if SigningKeyRecord.select().exists():
                return
            imported = self.import_key_files()
            if not imported:
                now = int(self._clock())
                self._insert(new_private_pem(), now, now)
            else:
                log.info("imported %d signing key(s) from %s into the database", imported, self.legacy_dir)

    def import_key_files(self) -> int:
        if self.legacy_dir is None or not self.legacy_dir.is_dir():
            return 0
        count = 0
        for path in sorted(self.legacy_dir.glob("rsa-*.pem")):
            created = int(path.name.split("-")[1])
            self._insert(path.read_bytes(), created, created)
            count += 1
        return count

    # -- rotation ------------------------------------------------------------------------------
    def rotate(self) -> SigningKey:
        """Add a key that signs after the pre-publication time; prune keys whose tokens have all
        expired. Returns the new key. The caller announces the change (lifecycle.signing_keys)."""
        # One rotation at a time over every host: one that read the keys before another's insert
        # would prune that new key (and both would sign from the same moment).
        with _exclusive(self.db):
            self.load()
            now = int(self._clock())
            newest = max((k.not_before for k in self._keys), default=0)
            kid = self._insert(new_private_pem(), now, max(now + self.prepublish_seconds, newest + 1))
            self.load()
            keep = {k.kid for k in self._published(now)}
            SigningKeyRecord.delete().where(SigningKeyRecord.kid.not_in(keep)).execute()
        self.load()
        return next(k for k in self._keys if k.kid == kid)

    # -- reading (no database) -------------------------------------------------------------------
    def _published(self, now: float) -> list[SigningKey]:
        """Keys not yet signing, the active key, and older keys whose successor started signing
        less than `retain_seconds` ago."""
        keys = self._keys
        return [k for i, k in enumerate(keys)
                if i == len(keys) - 1 or now - keys[i + 1].not_before < self.retain_seconds]

    @property
    def active(self) -> SigningKey:
        """The key that signs now: the newest whose `not_before` has come."""
        keys = self._loaded()
        now = self._clock()
        signing = [k for k in keys if k.not_before <= now]
        return signing[-1] if signing else keys[0]

    @property
    def upcoming(self) -> list[SigningKey]:
        """Published keys that do not sign yet."""
        now = self._clock()
        return [k for k in self._loaded() if k.not_before > now]

    def verifier(self, kid: str) -> Key | None:
        """The public key object for `kid`, if it is still published."""
        self._loaded()
        for key in self._published(self._clock()):
            if key.kid == kid:
                return key.verifier
        return None

    def jwks(self) -> dict:
        self._loaded()
        return {"keys": [k.public_jwk for k in reversed(self._published(self._clock()))]}
