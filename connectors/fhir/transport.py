"""The one door to a clinic's FHIR base: every HTTP request to the EHR goes through `Transport.send`
(blocking: workers, searches, the CLI) or `Transport.send_async` (on the IOLoop: an app's FHIR read,
no pool thread blocked on the EHR), held to the caller's `Bounds` (connectors/bounds.py). Both run
one core without I/O (`_attempts`: retries, waits, deadline, redirects, what an answer is) and
one check of an answer's head and size (`_body_limit`); each only drives its connection
(`connectors.fhir.connections`, `http.client`; `connectors.fhir.aio`, asyncio with llhttp).

- A wall-clock deadline per request, retries, `Retry-After` waits and every byte included: a
  watchdog (on the IOLoop, a timer of the loop) shuts the socket at the deadline, so an answer (its
  head or its body) dripping a byte a second ends there, not when the EHR stops; the connection
  and read timeouts never outlast it either.
- Connections are kept alive between requests: one is reused only after its answer was read
  whole, and closed after anything else.
- The body is streamed and read up to `max_bytes`; past it the connection is dropped.
- The JSON of a body (or of a Bulk Data ndjson line) is parsed only when it holds at most
  `max_bytes // JSON_VALUE_BYTES` values (`json_values`, counted on the bytes before parsing); a
  denser one (`[{},{},...]`: ~36 bytes of Python per byte) is refused (`BoundExceeded("json_values")`).
- `Retry-After` (delay-seconds or an HTTP-date, RFC 9110 10.2.3, read against the runtime's wall
  clock) is honoured up to `max_retry_after`; a longer one (or one past the deadline) ends the
  attempts as `ConnectorUnavailable`.
- Timeouts, refused or reset connections and TLS errors are retried as transient; a certificate
  that does not verify is permanent (`ConnectorError`, no retry: the next try meets the same one).
- Redirects are not followed: a 3xx is an error, never data.
- `confine` refuses, before any request, a URL outside the configured base *path* (scheme, host,
  port, path prefix at a `/` boundary; no `.`/`..` segments, no percent-encoded dots, slashes or
  backslashes, no user info)."""
from __future__ import annotations

import asyncio
import datetime as dt
import email.utils
import heapq
import http.client
import itertools
import json
import logging
import re
import socket
import ssl
import threading
import time
from types import MappingProxyType
from urllib.parse import urlsplit

import orjson

from connectors.base import BoundExceeded, ConnectorError, ConnectorUnavailable, DeadlineExceeded
from connectors.bounds import Bounds
from connectors.fhir.aio import AsyncConnections, HttpError, request_head
from connectors.fhir.connections import Connections

BACKOFF_SECONDS = 0.5            # doubled per attempt, unless the EHR says Retry-After
CHUNK_BYTES = 64 * 1024          # a body is read this much at a time
JSON_VALUE_BYTES = 8             # an answer's JSON is parsed only when it holds at most max_bytes/8 values
"""Parsed JSON costs memory per value and key (a `{}`, a `"a"`, a `1.5`), whatever its bytes: a body of
`[{},{},...]` just under the cap costs ~30x its size, `["a","a",...]` ~22x, where real FHIR JSON
holds a value per 10-30 bytes (a US Core Observation entry 10.5, Medplum's R4 definitions 15-30;
the densest seen, 7.5, is refused only past 94% of the cap) and costs 2-4.5x its size. Measured
(peak RSS of a child process over the body it holds; orjson 3.13): the worst body the rule admits
(`["a",...]` of max_bytes/8 values) costs 44 MiB at the 4 MiB interactive cap and 353 MiB at the
32 MiB batch cap, against 121 MiB and 941 MiB for `[{},...]` unbounded (a real 14 MiB FHIR
Bundle: 65 MiB)."""
DEFAULT_PORTS = MappingProxyType({"http": 80, "https": 443})
_ENCODED_SEPARATOR = re.compile(r"%(2e|2f|5c|25)", re.IGNORECASE)  # `.`, `/`, `\`, `%` spelled encoded
_PRINTABLE = re.compile(r"[!-~]+")
USER_AGENT = "svc-auth"
IDEMPOTENT = frozenset(("GET", "HEAD"))
STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)
"""What writing on a kept connection the EHR had just closed raises (before any answer)."""

log = logging.getLogger("svc_auth.connectors.fhir")


def _origin_and_path(url: str):
    """(scheme, host, port, path) of an absolute http(s) URL, or None when it is not one we call."""
    if not _PRINTABLE.fullmatch(url or "") or "\\" in url:
        return None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname or parts.username is not None or parts.password is not None:
        return None
    segments = parts.path.split("/")
    if any(s in (".", "..") for s in segments) or _ENCODED_SEPARATOR.search(parts.path):
        return None
    return scheme, parts.hostname.lower(), port or DEFAULT_PORTS[scheme], parts.path


def inside_base(url: str, base: str) -> bool:
    """Whether `url` is an absolute URL under the FHIR `base`: same scheme, host and port, and a path
    that is the base's or below it at a `/` boundary (`/fhir/R4` holds `/fhir/R4/Patient`, not
    `/fhir/R4x` nor `/fhir/R4/../admin`)."""
    return _inside(_origin_and_path(url), _origin_and_path(base.rstrip("/")))


def _inside(theirs, ours) -> bool:
    """`inside_base` of two `_origin_and_path` results (a URL's, its base's)."""
    if ours is None or theirs is None or ours[:3] != theirs[:3]:
        return False
    prefix = ours[3].rstrip("/") + "/"
    return theirs[3] == prefix[:-1] or theirs[3].startswith(prefix)


def same_origin(url: str, base: str) -> bool:
    """Whether `url` is an http(s) URL on the scheme, host and port of the FHIR `base` (a Bulk Data
    file of the EHR's: the only ones svc-auth follows, and sends its token to)."""
    ours, theirs = _origin_and_path(base.rstrip("/")), _origin_and_path(url)
    return ours is not None and theirs is not None and ours[:3] == theirs[:3]


def relative_to_base(url: str, base: str) -> str | None:
    """`url` relative to the FHIR `base` (`{base}/Patient/x` -> `Patient/x`), or None when it is not inside it."""
    if not inside_base(url, base):
        return None
    parts = urlsplit(url)
    prefix = urlsplit(base.rstrip("/")).path.rstrip("/") + "/"
    relative = parts.path[len(prefix):] if parts.path.startswith(prefix) else ""
    return relative + (f"?{parts.query}" if parts.query else "")


class Watchdog:
    """One thread per process that calls each watched function at its deadline (monotonic clock),
    unless it was cancelled first: the deadline of every EHR exchange, without a thread per
    request. The thread is woken only when a new deadline comes before every other one (with one
    request deadline, hardly ever): watching and cancelling are a heap push and a dict pop. Started
    on first use (after `serve` forked)."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._condition = threading.Condition()
        self._heap: list = []          # (deadline, number): live and cancelled ones (these dropped when due)
        self._live: dict = {}          # number -> fn, until called or cancelled
        self._numbers = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, deadline: float, fn) -> int:
        """Call `fn()` at `deadline`; returns the number `cancel` takes."""
        with self._condition:
            number = next(self._numbers)
            self._live[number] = fn
            heapq.heappush(self._heap, (deadline, number))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="svc-ehr-watchdog", daemon=True)
                self._thread.start()
            elif self._heap[0][1] == number:  # sooner than the thread's wait: it must wait less
                self._condition.notify()
            return number

    def cancel(self, number: int) -> bool:
        """Cancel `number`'s call; False when it was already called (or being called)."""
        with self._condition:
            return self._live.pop(number, None) is not None

    def _due(self):
        """The next function whose deadline has come (waiting for it), skipping cancelled ones."""
        with self._condition:
            while True:
                while self._heap and self._heap[0][1] not in self._live:
                    heapq.heappop(self._heap)
                now = self.clock()
                if self._heap and self._heap[0][0] <= now:
                    return self._live.pop(heapq.heappop(self._heap)[1])
                self._condition.wait(self._heap[0][0] - now if self._heap else None)

    def _run(self) -> None:
        while True:
            fn = self._due()
            try:
                fn()
            except Exception:  # a watched function must not stop the others' deadlines
                log.exception("EHR watchdog: a deadline's function failed")


class Transport:
    """HTTP to one FHIR base under one caller's `Bounds` (`operation_deadline` counts from here).
    `http` and `watchdog` are the process's (`connectors.fhir.cache.FhirState`): connections to the
    EHR are kept alive from one request to the next (`connectors.fhir.connections`), and one thread
    keeps every exchange's deadline. `clock` measures the deadlines (monotonic); `wall` is the
    runtime's clock (`runtime.clock.time`), against which an HTTP-date `Retry-After` is read."""

    def __init__(self, base: str, bounds: Bounds, http: Connections | None = None,
                 sleep=time.sleep, clock=time.monotonic, watchdog: Watchdog | None = None, wall=time.time,
                 aio: AsyncConnections | None = None, pause=asyncio.sleep):
        self.base = base.rstrip("/")
        self._base_parts = _origin_and_path(self.base)  # parsed once: `confine` runs on every request
        self.bounds = bounds
        self.http = http or Connections()
        self.sleep, self.pause, self.clock, self.wall = sleep, pause, clock, wall
        self.watchdog = watchdog or Watchdog(clock)
        self.aio = aio or AsyncConnections(self.http.per_origin, self.http.context)
        self.started = clock()

    def confine(self, url: str) -> str:
        """`url`, when it is inside this EHR's base; else `BoundExceeded("outside_base")` (no request made)."""
        if not _inside(_origin_and_path(url), self._base_parts):
            raise BoundExceeded("outside_base", f"The EHR at {self.base} sent a link outside its FHIR base "
                                                f"({url[:200]!r}); not followed.")
        return url

    def deadline(self) -> float:
        """When the request starting now must be done (monotonic clock)."""
        deadline = self.clock() + self.bounds.request_deadline
        if self.bounds.operation_deadline is not None:
            deadline = min(deadline, self.started + self.bounds.operation_deadline)
        return deadline

    def send(self, method: str, url: str, body: bytes | None = None, headers: dict | None = None):
        """(status, parsed JSON or None, headers), retrying 429, 5xx, timeouts and refused
        connections within the bounds. Raises `DeadlineExceeded`, `BoundExceeded` (`max_bytes`, `json_values`,
        `redirect`) or `ConnectorUnavailable` (attempts spent, or a `Retry-After` too long).
        Blocking (a pool thread, a worker): `_attempts` on `http.client` connections."""
        attempts = self._attempts(method, url, body, headers)
        step = next(attempts)
        while True:
            if step[0] == "sleep":
                self.sleep(step[1])
                outcome = None
            else:
                try:
                    outcome = self._exchange(method, *step[1:])
                except _Broken as exc:
                    outcome = exc
            try:
                step = attempts.send(outcome)
            except StopIteration as done:
                return done.value

    async def send_async(self, method: str, url: str, body: bytes | None = None, headers: dict | None = None):
        """`send` on the running IOLoop (`connectors.fhir.aio`: no thread blocked on the EHR): the
        same attempts, bounds and answers; the waits between attempts are the loop's."""
        attempts = self._attempts(method, url, body, headers)
        step = next(attempts)
        while True:
            if step[0] == "sleep":
                await self.pause(step[1])
                outcome = None
            else:
                try:
                    outcome = await self._exchange_async(method, *step[1:])
                except _Broken as exc:
                    outcome = exc
            try:
                step = attempts.send(outcome)
            except StopIteration as done:
                return done.value

    def _attempts(self, method: str, url: str, body, headers: dict | None):
        """The attempts of one request, without I/O (both drivers run it): yields
        `("exchange", origin, target, body, headers, url, deadline)`, to be sent back the outcome
        of one exchange ((status, headers, body or None) or `_Broken`), or `("sleep", seconds)`;
        returns `send`'s answer. Every retry, wait, deadline and redirect rule is here."""
        bounds, deadline, delay = self.bounds, self.deadline(), BACKOFF_SECONDS
        origin, target = _origin_and_target(url)
        host = f"{origin[1]}:{origin[2]}"
        sent = {"User-Agent": USER_AGENT, **(headers or {})}
        for attempt in range(1, bounds.attempts + 1):
            if deadline - self.clock() <= 0:
                raise self._late(url)
            outcome = yield "exchange", origin, target, body, sent, url, deadline
            if isinstance(outcome, _Broken):
                if self.clock() >= deadline:
                    raise self._late(url) from None
                if _certificate_refused(outcome.cause):
                    raise ConnectorError(f"The EHR at {host} presented a TLS certificate that does not verify "
                                         f"({str(outcome.cause)[:300]}); check its certificate chain and the FHIR "
                                         f"base URL.") from None
                failure, wait = type(outcome.cause).__name__, delay
            else:
                status, answered, data = outcome
                if 300 <= status < 400:
                    raise BoundExceeded("redirect", f"The EHR at {host} answered HTTP {status} (a redirect, to "
                                                    f"{str(answered.get('Location'))[:200]!r}); not followed.")
                if status != 429 and status < 500:
                    return status, self.parse(data, url), answered
                failure = f"HTTP {status}"
                wait = _retry_after(answered.get("Retry-After"), delay, self.wall())
            if attempt == bounds.attempts or wait > bounds.max_retry_after or self.clock() + wait >= deadline:
                raise ConnectorUnavailable(f"The EHR at {host} is unavailable ({failure}); the request will be "
                                           f"retried.")
            log.info("EHR %s answered %s; retrying in %.1f s", host, failure, wait)
            yield "sleep", wait
            delay *= 2
        raise AssertionError("unreachable")

    def lines(self, url: str, headers: dict | None, deadline: float):
        """The lines of a GET's body (an ndjson file of a Bulk Data export), streamed: no more than
        one line (at most `max_bytes`) in memory, each read waiting at most `request_deadline`, the
        whole body over by `deadline` (monotonic clock; a watchdog shuts the socket then). No retry:
        a body cut short raises `ConnectorUnavailable`, and the caller drops what it wrote of it. The
        connection is kept alive for the next request only when the body was read whole."""
        origin, target = _origin_and_target(url)
        host = f"{origin[1]}:{origin[2]}"
        if deadline - self.clock() <= 0:
            raise self._late(url)
        connection, _ = self.http.take(origin, min(self.bounds.connect, deadline - self.clock()), check=True)
        cut = threading.Event()
        watched = self.watchdog.watch(deadline, lambda: _shut(connection, cut))
        kept = False
        try:
            try:
                response = _request(connection, "GET", target, None, {"User-Agent": USER_AGENT, **(headers or {})},
                                    self.bounds.request_deadline)
            except (OSError, http.client.HTTPException) as exc:
                if cut.is_set() or self.clock() >= deadline:
                    raise self._late(url) from None
                raise ConnectorUnavailable(f"The EHR at {host} did not send a file ({type(exc).__name__}).") from None
            if response.status != 200:
                if 300 <= response.status < 400:
                    raise BoundExceeded("redirect", f"The EHR at {host} answered a file with HTTP {response.status} "
                                                    f"(a redirect); not followed.")
                raise ConnectorError(f"The EHR at {host} answered HTTP {response.status} to {urlsplit(url).path[:200]}.")
            pending = b""
            try:
                for chunk in self._chunks(response, url, deadline, cut):
                    pending += chunk
                    *complete, pending = pending.split(b"\n")
                    if len(pending) > self.bounds.max_bytes:
                        raise self._too_big(url)
                    for line in complete:
                        if line.strip():
                            yield self.within_values(line, url)
                kept = not response.will_close
            except (OSError, http.client.HTTPException) as exc:
                if cut.is_set() or self.clock() >= deadline:
                    raise self._late(url) from None
                raise ConnectorUnavailable(f"The EHR at {host} broke off a file ({type(exc).__name__}).") from None
            if pending.strip():
                yield self.within_values(pending, url)
        finally:
            if self.watchdog.cancel(watched) and kept:
                self.http.keep(origin, connection)
            else:
                connection.close()

    def _exchange(self, method: str, origin: tuple, target: str, body, headers: dict, url: str, deadline: float):
        """One attempt: (status, headers, body: bytes, or None when not read: a redirect, 429 or 5xx)
        on a kept-alive connection (a fresh one when a kept GET finds it closed before any answer).
        A watchdog shuts the socket at `deadline`, so neither the answer's head nor its body can
        drip past it. `_Broken` for a connection that failed (refused, reset, TLS, a timeout)."""
        for fresh_retry in (False, True):
            remaining = deadline - self.clock()
            if remaining <= 0:
                raise self._late(url)
            connection, reused = self.http.take(origin, min(self.bounds.connect, remaining),
                                                check=method not in IDEMPOTENT)
            cut = threading.Event()
            watched = self.watchdog.watch(deadline, lambda: _shut(connection, cut))
            kept = False
            try:
                try:
                    response = _request(connection, method, target, body, headers, max(deadline - self.clock(), 0.001))
                except (OSError, http.client.HTTPException) as exc:
                    if cut.is_set() or self.clock() >= deadline:
                        raise self._late(url) from None
                    if reused and not fresh_retry and method in IDEMPOTENT and isinstance(exc, STALE):
                        continue  # the EHR closed the kept connection as we wrote: once more, on a new one
                    raise _Broken(exc) from None
                status = response.status
                if not wants_body(status):
                    return status, response.headers, None
                data = self._read(response, url, deadline, cut)
                kept = not response.will_close
                return status, response.headers, data
            finally:
                if self.watchdog.cancel(watched) and kept:
                    self.http.keep(origin, connection)
                else:
                    connection.close()
        raise AssertionError("unreachable")

    def _read(self, response, url: str, deadline: float, cut: threading.Event) -> bytes:
        """The body, streamed: at most `max_bytes`, and over at `deadline` (the watchdog shuts the
        socket then, so no byte-by-byte drip outlasts it)."""
        limit = self.bounds.max_bytes
        self._check_declared(response.headers, url)
        chunks, size = [], 0
        try:
            for chunk in self._chunks(response, url, deadline, cut):
                size += len(chunk)
                if size > limit:
                    raise self._too_big(url)
                chunks.append(chunk)
            return b"".join(chunks)
        except (OSError, http.client.HTTPException) as exc:
            if cut.is_set() or self.clock() >= deadline:
                raise self._late(url) from None
            raise self._broken_off(url, exc) from None

    async def _exchange_async(self, method: str, origin: tuple, target: str, body, headers: dict, url: str,
                              deadline: float):
        """`_exchange` on the IOLoop (`connectors.fhir.aio`): one attempt on a kept-alive asyncio
        connection (a fresh one when a kept GET finds it closed before any answer), cut at
        `deadline` by a timer of the loop; the body read up to `max_bytes`."""
        request = request_head(method, target, origin, headers, body)
        for fresh_retry in (False, True):
            remaining = deadline - self.clock()
            if remaining <= 0:
                raise self._late(url)
            try:
                connection, reused = await self.aio.take(origin, min(self.bounds.connect, remaining))
            except (OSError, asyncio.TimeoutError) as exc:  # refused, unreachable, TLS, the connect timeout
                if self.clock() >= deadline:
                    raise self._late(url) from None
                raise _Broken(exc) from None
            kept = False
            try:
                try:
                    status, answered, data = await connection.exchange(
                        request, deadline - self.clock(), lambda status, head: self._body_limit(status, head, url))
                except (OSError, HttpError) as exc:
                    if connection.cut or self.clock() >= deadline:
                        raise self._late(url) from None
                    if connection.answered:
                        raise self._broken_off(url, exc) from None
                    if reused and not fresh_retry and method in IDEMPOTENT and connection.unanswered_close:
                        continue  # the EHR closed the kept connection as we wrote: once more, on a new one
                    raise _Broken(exc) from None
                if len(data or b"") > self.bounds.max_bytes:
                    raise self._too_big(url)
                kept = data is not None and connection.reusable
                return status, answered, data
            finally:
                self.aio.give_back(origin, connection, kept)
        raise AssertionError("unreachable")

    def _body_limit(self, status: int, head, url: str) -> int | None:
        """An answer's head read: how many body bytes to read at most (`max_bytes`; a Content-Length
        past it raises), or None to read none (a redirect, 429, 5xx: the attempts decide)."""
        if not wants_body(status):
            return None
        self._check_declared(head, url)
        return self.bounds.max_bytes

    def _check_declared(self, head, url: str) -> None:
        """`max_bytes` against an answer's declared Content-Length, before its body is read."""
        declared = head.get("Content-Length")
        # Past 18 digits it is past any limit: int() of 4,300 digits or more raises ValueError.
        if declared and declared.isascii() and declared.isdigit() and (len(declared) > 18
                                                                       or int(declared) > self.bounds.max_bytes):
            raise self._too_big(url)

    def _chunks(self, response, url: str, deadline: float, cut: threading.Event):
        """The body as it comes, a read at a time, none past `deadline`; a body cut short of its
        Content-Length raises `IncompleteRead`. The response is closed at its end (`read1` leaves
        a Content-Length answer open there)."""
        while True:
            chunk = response.read1(CHUNK_BYTES)
            if cut.is_set() or self.clock() >= deadline:
                raise self._late(url)
            if not chunk:
                if response.length:  # the connection ended before its Content-Length
                    raise http.client.IncompleteRead(b"", response.length)
                response.close()
                return
            yield chunk

    def parse(self, data: bytes | None, url: str):
        """An answer's body as JSON (`_json`), once `within_values`."""
        return _json(self.within_values(data, url) if data else data)

    def within_values(self, data: bytes, url: str) -> bytes:
        """`data` when its JSON can hold at most `max_bytes // JSON_VALUE_BYTES` values (`json_values`);
        else `BoundExceeded("json_values")`, before anything is parsed (`JSON_VALUE_BYTES`: why)."""
        limit = self.bounds.max_bytes // JSON_VALUE_BYTES
        if len(data) > limit and json_values(data) > limit:
            raise BoundExceeded("json_values", f"The EHR at {urlsplit(url).netloc} answered JSON of more than "
                                               f"{limit} values (the {self.bounds.name} limit: one per "
                                               f"{JSON_VALUE_BYTES} bytes of {self.bounds.max_bytes}) "
                                               f"({urlsplit(url).path[:200]}); not parsed.")
        return data

    def _late(self, url: str) -> DeadlineExceeded:
        whole = self.bounds.operation_deadline
        if whole not in (None, self.bounds.request_deadline) and self.clock() >= self.started + whole:
            return DeadlineExceeded("deadline", f"The EHR at {urlsplit(url).netloc} did not answer all the requests "
                                                f"of this {self.bounds.name} build within its deadline ({whole:g} s).")
        return DeadlineExceeded("deadline", f"The EHR at {urlsplit(url).netloc} did not answer within the "
                                            f"{self.bounds.name} deadline ({self.bounds.request_deadline:g} s per "
                                            f"request, retries included).")

    @staticmethod
    def _broken_off(url: str, exc: BaseException) -> ConnectorUnavailable:
        return ConnectorUnavailable(f"The EHR at {urlsplit(url).netloc} broke off its answer ({type(exc).__name__}); "
                                    f"the request will be retried.")

    def _too_big(self, url: str) -> BoundExceeded:
        return BoundExceeded("max_bytes", f"The EHR at {urlsplit(url).netloc} answered more than the "
                                          f"{self.bounds.name} limit of {self.bounds.max_bytes} bytes "
                                          f"({urlsplit(url).path[:200]}); not read further.")


class _Broken(Exception):
    """A connection to the EHR that failed before an answer (`cause`: the socket's, TLS's or HTTP's error)."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


def wants_body(status: int) -> bool:
    """Whether an answer's body is read: not a redirect's, a 429's or a 5xx's (the attempts decide on its head)."""
    return not (300 <= status < 400 or status == 429 or status >= 500)


def _origin_and_target(url: str) -> tuple[tuple[str, str, int], str]:
    """((scheme, host, port), path and query) of an absolute http(s) URL; `ConnectorError` for any other."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
        scheme = ""
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        raise ConnectorError(f"Not an http(s) URL of an EHR: {url[:200]!r}.")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return (scheme, parts.hostname.lower(), port or DEFAULT_PORTS[scheme]), target


def _request(connection, method: str, target: str, body, headers: dict, timeout: float):
    """Send one request on `connection` (connected first when it is new), each socket wait at most
    `timeout`, and read the answer's status line and headers."""
    if connection.sock is None:
        connection.connect()
    connection.sock.settimeout(timeout)
    connection.request(method, target, body=body, headers=headers)
    return connection.getresponse()


def _shut(connection, cut: threading.Event) -> None:
    """The watchdog: unblock a connect, write or read waiting on the socket."""
    cut.set()
    sock = connection.sock
    try:
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed


def json_values(data: bytes) -> int:
    """An upper bound of the values and keys that parsing `data` as JSON makes: each is the first of
    its array (`[`) or object (`{`), follows a `,` or a `:`, or is the document (counted in strings
    too: more, never fewer). Four C scans of the bytes, no parse."""
    return 1 + data.count(b"[") + data.count(b"{") + data.count(b",") + data.count(b":")


def _json(data: bytes | None):
    """The body as JSON (orjson; `json` for what it refuses, e.g. an integer past 64 bits), or None."""
    if not data:
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(data)
    except (ValueError, RecursionError):  # not JSON, or nested past what the parser follows
        return None


def _retry_after(value: str | None, default: float, now: float) -> float:
    """Seconds to wait from a `Retry-After` header: delay-seconds, or an HTTP-date taken against
    `now` (the runtime's wall clock; a date passed is 0); `default` when absent or unreadable."""
    if value is None:
        return default
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        return max(0.0, float(value))  # not RFC 9110's grammar, but what some EHRs send ("0.5")
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return default
    if when.tzinfo is None:  # "-0000", RFC 5322's unknown zone: HTTP-dates are GMT
        when = when.replace(tzinfo=dt.timezone.utc)
    return max(0.0, when.timestamp() - now)


def _certificate_refused(exc: BaseException) -> bool:
    """Whether a connection's error is a certificate that failed verification (permanent), as opposed to
    a TLS handshake broken off or timed out (transient)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ssl.SSLCertVerificationError):
            return True
        inner = [a for a in getattr(exc, "args", ()) if isinstance(a, BaseException)]
        exc = inner[0] if inner else (exc.__cause__ or exc.__context__)
    return False

