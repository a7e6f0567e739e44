"""Token signing and verification: the one place JWTs are made and checked.

Audiences keep token kinds apart: a user access token (`platform`), a partner API token
(`partner-api`), a backend app's system token (`fhir-system`), a sandbox settings token (`sandbox`)
and an ID token (the client id) are each refused where another is expected. Expiry is checked against the runtime's clock, so tests can move time.
"""
from __future__ import annotations

import base64
import json
import threading

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding
from jose import jwt
from jose.exceptions import JOSEError

from ops.jsontext import compact_json
from keys.signing import ALGORITHM, KeyRing
from models.ids import new_secret

PLATFORM_AUDIENCE = "platform"
PARTNER_API_AUDIENCE = "partner-api"
SANDBOX_AUDIENCE = "sandbox"
SYSTEM_AUDIENCE = "fhir-system"  # a backend app's system token (SMART Backend Services; oauth/system_credentials.py)
ACCESS_TOKEN_TYPE = "at+jwt"

VERIFIED_CACHE_SIZE = 4096     # verified tokens remembered per process (about 4 MB at most)
_PKCS1V15 = padding.PKCS1v15()
_SHA256 = hashes.SHA256()


def _b64url(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def rsa_signature(private_key, signing_input: bytes) -> bytes:
    """RS256: RSASSA-PKCS1-v1_5 with SHA-256 (its own frame, so profiles show the signature alone)."""
    return private_key.sign(signing_input, _PKCS1V15, _SHA256)


class InvalidToken(Exception):
    """The token failed verification; the message says why (for logs, not for clients)."""


class TokenService:
    def __init__(self, keyring: KeyRing, issuer_claim: str, clock):
        self.keyring = keyring
        self.clock = clock
        self.issuer = issuer_claim
        self._headers: dict[tuple[str, str], bytes] = {}  # (kid, typ) -> encoded JWS header
        # (token, audience, typ) -> (claims, kid): a token presented again (an app's every FHIR read)
        # skips the JWS parse and the RSA verification; its expiry and its key's publication are
        # checked on every use. Dropped when the key set changes.
        self._verified: dict[tuple, tuple[dict, str]] = {}
        self._verified_lock = threading.Lock()
        self._generation = 0  # bumped by `forget`: a verification that raced with it is not remembered

    def _header(self, kid: str, typ: str) -> bytes:
        encoded = self._headers.get((kid, typ))
        if encoded is None:
            header = json.dumps({"alg": ALGORITHM, "kid": kid, "typ": typ}, separators=(",", ":"), sort_keys=True)
            encoded = self._headers[(kid, typ)] = _b64url(header.encode())
        return encoded

    def sign(self, claims: dict, typ: str = "JWT") -> str:
        """The compact RS256 JWS of `claims` (integer times) under the active key: the same bytes
        as python-jose's `jwt.encode` (sorted header, compact JSON), signed with `cryptography`
        directly, the header encoded once per key (a token's CPU is mostly this signature)."""
        key = self.keyring.active
        signing_input = self._header(key.kid, typ) + b"." + _b64url(compact_json(claims))
        signature = rsa_signature(key.private, signing_input)
        return (signing_input + b"." + _b64url(signature)).decode("ascii")

    def base_claims(self, subject: str, audience: str, lifetime: int) -> dict:
        now = int(self.clock.time())
        return {"iss": self.issuer, "sub": subject, "aud": audience, "iat": now, "exp": now + lifetime}

    def access_token(self, subject: str, audience: str, lifetime: int, **extra) -> tuple[str, dict]:
        """Sign an RFC 9068-style access token; returns (token, claims) with a fresh `jti` (or the
        `jti` given)."""
        claims = self.base_claims(subject, audience, lifetime)
        claims["jti"] = extra.pop("jti") if "jti" in extra else new_secret(16)
        claims.update(extra)
        return self.sign(claims, typ=ACCESS_TOKEN_TYPE), claims

    def verify(self, token: str, audience: str, typ: str | None = ACCESS_TOKEN_TYPE) -> dict:
        """Claims of `token` if it is ours, unexpired, RS256, of `typ`, for `audience` (a copy: the
        caller may change it). A verified token is remembered (until the key set changes: `forget`),
        so its next use checks only its expiry and that its key is still published; revocation is
        not decided here (the deny-list is asked on every use)."""
        key = (token, audience, typ)
        remembered = self._verified.get(key) if isinstance(token, str) else None
        if remembered is not None:
            claims, kid = remembered
            if claims["exp"] <= self.clock.time():
                raise InvalidToken("expired")
            if self.keyring.verifier(kid) is None:
                raise InvalidToken("unknown kid")
            return dict(claims)
        generation = self._generation
        claims, kid = self._verify(token, audience, typ)
        with self._verified_lock:
            if generation != self._generation:
                return dict(claims)
            if len(self._verified) >= VERIFIED_CACHE_SIZE:  # drop the older half (dicts keep insertion order)
                self._verified = dict(list(self._verified.items())[VERIFIED_CACHE_SIZE // 2:])
            self._verified[key] = (claims, kid)
        return dict(claims)

    def forget(self) -> None:
        """Forget every verification (the key set changed: a removed key verifies nothing from now on)."""
        with self._verified_lock:
            self._generation += 1
            self._verified = {}

    def hint_claims(self, token: str, audience: str) -> dict:
        """Claims of an ID token this service signed for the client `audience`, expired or not: an
        `id_token_hint` (OIDC Core 3.1.2.1), which a relying party sends from its last sign-in,
        often after the token expired. `InvalidToken` for anything else (an access token too)."""
        return self._verify(token, audience, "jwt", check_expiry=False)[0]

    def _verify(self, token: str, audience: str, typ: str | None, check_expiry: bool = True) -> tuple[dict, str]:
        """(claims, kid) of a token checked in full (its expiry unless `check_expiry` is False)."""
        if not isinstance(token, str) or token.count(".") != 2 or len(token) > 8192:
            raise InvalidToken("not a compact JWS")
        try:
            header = jwt.get_unverified_header(token)
        except JOSEError as exc:
            raise InvalidToken(f"bad header: {exc}") from None
        if header.get("alg") != ALGORITHM:
            raise InvalidToken(f"algorithm {header.get('alg')!r} not accepted")
        if typ is not None and str(header.get("typ", "")).lower() != typ:
            raise InvalidToken(f"token type {header.get('typ')!r} is not {typ!r}")
        kid = str(header.get("kid", ""))
        key = self.keyring.verifier(kid)
        if key is None:
            raise InvalidToken("unknown kid")
        try:
            claims = jwt.decode(token, key, algorithms=[ALGORITHM], audience=audience, issuer=self.issuer,
                                options={"verify_exp": False, "verify_iat": False, "verify_nbf": False,
                                         "verify_at_hash": False})
        except JOSEError as exc:
            raise InvalidToken(str(exc)) from None
        exp = claims.get("exp")
        if not isinstance(exp, int) or check_expiry and exp <= self.clock.time():
            raise InvalidToken("expired")
        return claims, kid
