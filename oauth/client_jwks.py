"""Backend apps' key sets, as the token endpoint verifies their assertions with (one per process,
owned by the runtime: `runtime.client_jwks`).

A stored JWKS (`apps ... --jwks-file`) is read from the application. A JWKS URL (`--jwks-url`) is
fetched only from that URL, never from one a request names:
- with a deadline (`FETCH_TIMEOUT` seconds for the whole answer, every byte included), at most
  `MAX_JWKS_BYTES`, redirects not followed, a 200 only;
- kept `CACHE_SECONDS`, then fetched again when next needed (a failed fetch keeps the keys
  fetched before, at most `MAX_STALE_SECONDS` after they were fetched: a key the partner removed
  stops verifying within the hour even while its host is down);
- an assertion naming a `kid` the cached set lacks makes one fetch at once (the app rotated its
  keys), but at most one fetch per app every `REFETCH_INTERVAL` seconds, whatever the requests
  say: a flood of made-up kids costs the app's JWKS host one request a minute per process.
A set that cannot be fetched or read verifies nothing: the assertion is refused (`invalid_client`).
"""
from __future__ import annotations

import logging
import threading
import time

import urllib3

from oauth.client_keys import MAX_JWKS_BYTES, JwksError, find_key, parse_jwks, stored_jwks

FETCH_TIMEOUT = 5.0
CACHE_SECONDS = 300
MAX_STALE_SECONDS = 3600  # keys kept past their cache time while the URL cannot be read, at most
REFETCH_INTERVAL = 60
CHUNK = 16 * 1024

log = logging.getLogger("svc_auth.oauth.client_jwks")


class JwksUnavailable(Exception):
    """The app's JWKS URL could not be fetched or read; the message says why (for the client)."""


class _Entry:
    __slots__ = ("url", "jwks", "fetched_at", "attempted_at", "lock")

    def __init__(self, url: str):
        self.url = url
        self.jwks: dict | None = None
        self.fetched_at = float("-inf")
        self.attempted_at = float("-inf")
        self.lock = threading.Lock()


class ClientKeySets:
    """The key sets of backend apps in this process: `key(app, kid, alg)`."""

    MAX_APPS = 10_000

    def __init__(self, monotonic=time.monotonic, http: urllib3.PoolManager | None = None):
        self.monotonic = monotonic
        self.http = http or urllib3.PoolManager(num_pools=16, retries=False, maxsize=4)
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self.fetches = 0  # JWKS URL requests made by this process (tests and metrics read it)

    def key(self, app, kid: str, alg: str) -> dict | None:
        """The public JWK of `app` with this `kid` for `alg`, or None when it has none (after at
        most one refetch of its URL, rate-limited). JwksUnavailable when its URL cannot be read
        and no keys are known."""
        if not app.jwks_url:
            return find_key(stored_jwks(app.jwks), kid, alg)
        entry = self._entry(app.id, app.jwks_url)
        with entry.lock:
            now = self.monotonic()
            if entry.jwks is None or now - entry.fetched_at >= CACHE_SECONDS:
                self._refresh(entry, now)  # the first use, or stale
            found = find_key(entry.jwks, kid, alg)
            if found is None and entry.jwks is not None and now - entry.attempted_at >= REFETCH_INTERVAL:
                self._refresh(entry, now)  # an unknown kid: the app may have rotated its keys
                found = find_key(entry.jwks, kid, alg)
            if entry.jwks is None:
                raise JwksUnavailable("The application's JWKS URL could not be read; its keys are unknown.")
            return found

    def _entry(self, app_id: str, url: str) -> _Entry:
        with self._lock:
            entry = self._entries.get(app_id)
            if entry is None or entry.url != url:  # a new URL registered: start afresh
                if len(self._entries) >= self.MAX_APPS:
                    self._entries = {}
                entry = self._entries[app_id] = _Entry(url)
            return entry

    def _refresh(self, entry: _Entry, now: float) -> None:
        """One fetch of the entry's URL, unless one was tried within REFETCH_INTERVAL."""
        if now - entry.attempted_at < REFETCH_INTERVAL:
            return
        entry.attempted_at = now
        try:
            entry.jwks = parse_jwks(self._fetch(entry.url), strict=False)
            entry.fetched_at = now
        except (JwksUnavailable, JwksError) as exc:
            if entry.jwks is not None and now - entry.fetched_at > MAX_STALE_SECONDS:
                entry.jwks = None
            log.warning("JWKS %s: %s (keeping %s)", entry.url, exc,
                        "the keys fetched before" if entry.jwks is not None else "no keys")

    def _fetch(self, url: str) -> bytes:
        self.fetches += 1
        deadline = time.monotonic() + FETCH_TIMEOUT
        try:
            response = self.http.request("GET", url, headers={"Accept": "application/json"}, redirect=False,
                                         preload_content=False,
                                         timeout=urllib3.Timeout(connect=FETCH_TIMEOUT, read=FETCH_TIMEOUT))
        except urllib3.exceptions.HTTPError as exc:
            raise JwksUnavailable(f"request failed: {type(exc).__name__}") from None
        done = False
        try:
            if response.status != 200:
                raise JwksUnavailable(f"HTTP {response.status}")
            body = bytearray()
            while True:
                if time.monotonic() > deadline:
                    raise JwksUnavailable(f"no whole answer within {FETCH_TIMEOUT} seconds")
                chunk = response.read1(CHUNK) if hasattr(response, "read1") else response.read(CHUNK)
                if not chunk:
                    break
                body += chunk
                if len(body) > MAX_JWKS_BYTES:
                    raise JwksUnavailable(f"larger than {MAX_JWKS_BYTES} bytes")
            done = True
            return bytes(body)
        except urllib3.exceptions.HTTPError as exc:
            raise JwksUnavailable(f"reading failed: {type(exc).__name__}") from None
        finally:
            if not done:
                response.close()  # never hand a half-read connection back to the pool
            response.release_conn()
