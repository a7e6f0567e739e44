"""ID token verification per the spec: RS256, key by `kid` from the JWKS, `iss` and `aud` checked.

The JWKS is fetched once and cached; an unknown `kid` (the service rotated its keys) triggers one
refresh, at most every `min_refresh_seconds`, so forged `kid`s cannot make the app hammer the JWKS.
"""
from __future__ import annotations

import asyncio
import json
import time

from jose import jwt
from jose.exceptions import JOSEError
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

ALGORITHM = "RS256"


class InvalidIdToken(Exception):
    """The ID token is not one the service issued to this app; the message says why."""


class JwksCache:
    """The service's public keys by `kid`, fetched lazily and refreshed on an unknown `kid`."""

    def __init__(self, url: str, min_refresh_seconds: float = 30.0, monotonic=time.monotonic):
        self.url = url
        self.min_refresh_seconds = min_refresh_seconds
        self.fetch_count = 0
        self._monotonic = monotonic
        self._keys: dict[str, dict] = {}
        self._fetched_at: float | None = None
        self._lock = asyncio.Lock()

    async def key(self, kid: str) -> dict | None:
        if kid in self._keys:
            return self._keys[kid]
        async with self._lock:
            if kid in self._keys:  # another request refreshed while we waited
                return self._keys[kid]
            if self._fetched_at is None or self._monotonic() - self._fetched_at >= self.min_refresh_seconds:
                await self._fetch()
        return self._keys.get(kid)

    async def _fetch(self) -> None:
        try:
            response = await AsyncHTTPClient().fetch(self.url, request_timeout=10)
            document = json.loads(response.body)
        except (HTTPClientError, OSError, ValueError) as exc:
            raise InvalidIdToken(f"cannot read the JWKS at {self.url}: {exc}") from None
        self.fetch_count += 1
        self._fetched_at = self._monotonic()
        self._keys = {k["kid"]: k for k in document.get("keys", []) if isinstance(k, dict) and k.get("kid")}


class IdTokenVerifier:
    def __init__(self, jwks: JwksCache, issuer: str, client_id: str):
        self.jwks = jwks
        self.issuer = issuer
        self.client_id = client_id

    async def verify(self, token: str) -> dict:
        """The claims of `token`, or `InvalidIdToken`."""
        try:
            header = jwt.get_unverified_header(token)
        except JOSEError:
            raise InvalidIdToken("not a JWT") from None
        if header.get("alg") != ALGORITHM:
            raise InvalidIdToken(f"algorithm {header.get('alg')!r} is not RS256")
        key = await self.jwks.key(str(header.get("kid", "")))
        if key is None:
            raise InvalidIdToken(f"no key with kid {header.get('kid')!r} in the JWKS")
        try:
            return jwt.decode(token, key, algorithms=[ALGORITHM], audience=self.client_id, issuer=self.issuer,
                              options={"verify_at_hash": False})
        except JOSEError as exc:
            raise InvalidIdToken(str(exc)) from None
