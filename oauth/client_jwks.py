"""Backend apps' key sets, as the token endpoint verifies their assertions with (one per process,
owned by the runtime: `runtime.client_jwks`).

A stored JWKS (`apps ... --jwks-file`) is read from the application. A JWKS URL (`--jwks-url`) is
fetched only from that URL, never from one a request names:
- with a deadline (`FETCH_TIMEOUT` seconds for the whole exchange: the connection, every address
  the name resolves to within what remains of it, the status line and headers, every byte of the
  body; the socket is closed when it passes; the name's resolution is the system resolver's), at
  most `MAX_JWKS_BYTES`, redirects not followed, a 200 only, over the standard library's
  `http.client` (https: the certificate and host name verified);
- by one request, which holds only its own pool thread: while it runs, the app's other requests
  verify with the keys fetched before, and one whose kid they lack is answered at once
  (`JwksBeingFetched`: 503 with Retry-After, nothing is known of that kid yet), never waiting for
  the fetch;
- kept `CACHE_SECONDS`, then fetched again when next needed (a failed fetch keeps the keys
  fetched before, at most `MAX_STALE_SECONDS` after they were fetched: a key the partner removed
  stops verifying within the hour even while its host is down);
- an assertion naming a `kid` the cached set lacks makes one fetch at once (the app rotated its
  keys), but at most one fetch per app every `REFETCH_INTERVAL` seconds, whatever the requests
  say: a flood of made-up kids costs the app's JWKS host one request a minute per process;
- fetched again at an app's next assertion once any application changed (`recheck`, on the
  applications change topic: an operator re-registering a JWKS URL, after the partner removed a
  leaked key from it, must not see this process keep verifying with that key), `RECHECK_INTERVAL`
  seconds after the last fetch at the soonest (however often applications change, e.g. a developer
  saving a manifest in a loop, a JWKS host gets at most that from one process); the keys fetched
  before verify meanwhile, as while the cache is refreshed;
- at most `max_fetches` fetches at once in the process (a quarter of its pool's threads, at least
  one): apps whose hosts hang hold at most that many pool threads; a fetch wanted beyond it is not
  made, and the request is answered as while its app's keys are being fetched (503, Retry-After).
A set that cannot be fetched or read verifies nothing: the assertion is refused (`invalid_client`).
"""
from __future__ import annotations

import http.client
import logging
import socket
import ssl
import threading
import time
from urllib.parse import urlsplit

from oauth.client_keys import MAX_JWKS_BYTES, JwksError, find_key, parse_jwks, stored_jwks

FETCH_TIMEOUT = 5.0
CACHE_SECONDS = 300
MAX_STALE_SECONDS = 3600  # keys kept past their cache time while the URL cannot be read, at most
REFETCH_INTERVAL = 60
RECHECK_INTERVAL = 5  # seconds between fetches of one app's URL, at least, when applications change
RETRY_AFTER = 1  # seconds: when a request whose kid is not cached may ask again while its app's keys are fetched
CHUNK = 16 * 1024

log = logging.getLogger("svc_auth.oauth.client_jwks")


class JwksUnavailable(Exception):
    """The app's JWKS URL could not be fetched or read; the message says why (for the client)."""


class JwksBeingFetched(JwksUnavailable):
    """The kid is not among the app's cached keys while they are being fetched (or while the
    process's fetches are all out): nothing is known yet, ask again in `RETRY_AFTER` seconds."""


class _Entry:
    __slots__ = ("url", "jwks", "fetched_at", "attempted_at", "recheck", "lock")

    def __init__(self, url: str):
        self.url = url
        self.jwks: dict | None = None
        self.fetched_at = float("-inf")
        self.attempted_at = float("-inf")
        self.recheck = False  # an application changed since the last attempt: fetch at the next use
        self.lock = threading.Lock()


class ClientKeySets:
    """The key sets of backend apps in this process: `key(app, kid, alg)`."""

    MAX_APPS = 10_000

    def __init__(self, monotonic=time.monotonic, max_fetches: int = 2):
        self.monotonic = monotonic
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._fetching = threading.BoundedSemaphore(max(1, max_fetches))
        self.fetches = 0  # JWKS URL requests made by this process (tests and metrics read it)

    def key(self, app, kid: str, alg: str) -> dict | None:
        """The public JWK of `app` with this `kid` for `alg`, or None when it has none (after at
        most one refetch of its URL, rate-limited). JwksUnavailable when its URL cannot be read
        and no keys are known, or when another request is fetching them and the kid is not cached."""
        if not app.jwks_url:
            return find_key(stored_jwks(app.jwks), kid, alg)
        entry = self._entry(app.id, app.jwks_url)
        busy = False
        if self._due(entry, kid, alg) and entry.lock.acquire(blocking=False):  # held: another request fetches
            try:
                if self._due(entry, kid, alg):  # nobody fetched it meanwhile
                    busy = not self._fetching.acquire(blocking=False)  # the process's fetches are all out
                    if not busy:
                        try:
                            self._refresh(entry)
                        finally:
                            self._fetching.release()
            finally:
                entry.lock.release()
        found = find_key(entry.jwks, kid, alg)
        if found is None and (busy or entry.lock.locked()):
            raise JwksBeingFetched(f"The application's keys are being fetched from its JWKS URL; "
                                   f"try again in {RETRY_AFTER} second.")
        if entry.jwks is None:
            raise JwksUnavailable("The application's JWKS URL could not be read; its keys are unknown.")
        return found

    def recheck(self) -> None:
        """An application changed (its keys may have been registered again): each app's next
        assertion fetches its URL again; the keys fetched before verify meanwhile."""
        with self._lock:
            for entry in self._entries.values():
                entry.recheck = True

    def _due(self, entry: _Entry, kid: str, alg: str) -> bool:
        """Is a fetch wanted (the first use, stale keys, an unknown kid: the app may have rotated
        its keys) and allowed (none tried within REFETCH_INTERVAL)? After `recheck`: wanted, and
        allowed RECHECK_INTERVAL after the last try."""
        now = self.monotonic()
        if entry.recheck and now - entry.attempted_at >= RECHECK_INTERVAL:
            return True
        if now - entry.attempted_at < REFETCH_INTERVAL:
            return False
        return now - entry.fetched_at >= CACHE_SECONDS or find_key(entry.jwks, kid, alg) is None

    def _entry(self, app_id: str, url: str) -> _Entry:
        with self._lock:
            entry = self._entries.get(app_id)
            if entry is None or entry.url != url:  # a new URL registered: start afresh
                if len(self._entries) >= self.MAX_APPS:
                    self._entries = {}
                entry = self._entries[app_id] = _Entry(url)
            return entry

    def _refresh(self, entry: _Entry) -> None:
        """One fetch of the entry's URL (its lock held); a failure keeps the keys fetched before,
        at most MAX_STALE_SECONDS."""
        now = entry.attempted_at = self.monotonic()
        entry.recheck = False
        try:
            entry.jwks = parse_jwks(self._fetch(entry.url), strict=False)
            entry.fetched_at = now
        except (JwksUnavailable, JwksError) as exc:
            if entry.jwks is not None and now - entry.fetched_at > MAX_STALE_SECONDS:
                entry.jwks = None
            log.warning("JWKS %s: %s (keeping %s)", entry.url, exc,
                        "the keys fetched before" if entry.jwks is not None else "no keys")

    def _fetch(self, url: str) -> bytes:
        """The body at `url` (a 200, at most MAX_JWKS_BYTES), all of it within FETCH_TIMEOUT: the
        connection (its name resolution aside), every byte of the status line and headers, the
        body. A per-read timeout alone lets a host that drips a byte every few seconds hold the
        fetch (and a pool thread) for as long as it likes; `_Deadline` connects within what remains
        of the deadline and closes the socket when it passes."""
        self.fetches += 1
        parts = urlsplit(url)
        tls = ssl.create_default_context() if parts.scheme == "https" else None
        deadline = _Deadline(FETCH_TIMEOUT)
        connection = deadline.connection = _Connection(parts.hostname, parts.port or (443 if tls else 80),
                                                       deadline.connect, tls)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        try:
            connection.connect()
            deadline.check()  # it expired while connecting: no socket was there to close
            connection.request("GET", target, headers={"Accept": "application/json"})
            response = connection.getresponse()  # a redirect is a status like any other: never followed
            if response.status != 200:
                raise JwksUnavailable(f"HTTP {response.status}")
            body = bytearray()
            while chunk := response.read1(CHUNK):
                body += chunk
                if len(body) > MAX_JWKS_BYTES:
                    raise JwksUnavailable(f"larger than {MAX_JWKS_BYTES} bytes")
            deadline.check()
            return bytes(body)
        except (OSError, http.client.HTTPException) as exc:
            if deadline.expired:
                raise JwksUnavailable(f"no whole answer within {FETCH_TIMEOUT} seconds") from None
            raise JwksUnavailable(f"request failed: {type(exc).__name__}") from None
        finally:
            deadline.cancel()
            connection.close()


class _Connection(http.client.HTTPConnection):
    """`http.client`'s connection whose socket `open_socket` makes (the deadline's `connect`), then
    TLS wraps when `tls` is given (the certificate and host name verified)."""

    def __init__(self, host: str, port: int, open_socket, tls: ssl.SSLContext | None):
        super().__init__(host, port, timeout=FETCH_TIMEOUT)
        self.open_socket, self.tls = open_socket, tls

    def connect(self) -> None:
        self.sock = self.open_socket((self.host, self.port))  # from here the deadline's timer can shut it
        if self.tls is not None:
            self.sock = self.tls.wrap_socket(self.sock, server_hostname=self.host)


class _Deadline:
    """A fetch's deadline, `seconds` from now: its `connection` connects within what remains of it
    (`connect`), and its socket is closed when it passes (a timer thread), so whatever the fetch
    is waiting for then fails at once; `check` raises once it has expired."""

    def __init__(self, seconds: float):
        self.connection: http.client.HTTPConnection | None = None
        self._fired = False
        self._ends = time.monotonic() + seconds
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    @property
    def expired(self) -> bool:
        return self._fired or self._ends <= time.monotonic()

    def connect(self, address: tuple, timeout=None, source_address=None) -> socket.socket:
        """`socket.create_connection`, but the addresses tried share what remains of the deadline
        (it gives each one the whole `timeout`, and the timer cannot close a socket still
        connecting)."""
        failure: OSError = TimeoutError("no time left to connect")
        for family, kind, proto, _, sockaddr in socket.getaddrinfo(*address, 0, socket.SOCK_STREAM):
            remaining = self._ends - time.monotonic()
            if remaining <= 0:
                break
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(remaining)
                sock.connect(sockaddr)
                return sock
            except OSError as exc:
                sock.close()
                failure = exc
        raise failure

    def _expire(self) -> None:
        self._fired = True
        sock = self.connection.sock if self.connection is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed

    def check(self) -> None:
        if self.expired:
            raise JwksUnavailable(f"no whole answer within {FETCH_TIMEOUT} seconds")

    def cancel(self) -> None:
        self._timer.cancel()
