"""Kept-alive asyncio connections to the clinics' EHRs, per origin, and one HTTP/1.1 exchange on
one: the driver of `transport.Transport.send_async` on the IOLoop (an app's FHIR read: no pool
thread blocks on the EHR, nor is woken by its answer). The answer is parsed by llhttp
(`httptools`); the transport holds every bound and decides what an answer means.

- A request takes an idle connection of its origin (one the EHR closed while idle is seen closed
  by the loop itself, never written to) or a new one, connected within the connect timeout (HTTPS
  verifies the EHR's certificate and host name with the process's `ssl` context), and gives it
  back (`give_back`) only when its answer was read whole and the EHR keeps it open; any other
  outcome closes it. At most `per_origin` idle per origin, `MAX_ORIGINS` origins (the least recently used
  origin's closed past it), as `connections.Connections`.
- An exchange is cut at its deadline (a timer of the loop closes the connection: no answer drips
  past it), reads no body the transport declined (a redirect, 429, 5xx) and stops reading one past
  the transport's limit (the connection then closed)."""
from __future__ import annotations

import asyncio
import re
import ssl

import httptools

from connectors.fhir.connections import MAX_ORIGINS

HttpError = httptools.HttpParserError
"""An answer that is not HTTP/1.1 (llhttp refused it)."""
_SAFE_VALUE = re.compile(r"[^\r\n\x00]*")
_SAFE_TARGET = re.compile(r"[!-~]+")


class Head(dict):
    """An answer's header fields by lower-case name (the last of a repeated one); `get` any case."""

    def get(self, name: str, default=None):
        return super().get(name.lower(), default)


def request_head(method: str, target: str, origin: tuple[str, str, int], headers: dict, body: bytes | None) -> bytes:
    """A request's bytes (head and body) as `http.client` would send them; ValueError for a target or a
    header value that would split the request."""
    scheme, host, port = origin
    if not _SAFE_TARGET.fullmatch(target):
        raise ValueError(f"Not a request target: {target[:200]!r}")
    authority = f"[{host}]" if ":" in host else host
    if port != (443 if scheme == "https" else 80):
        authority = f"{authority}:{port}"
    lines = [f"{method} {target} HTTP/1.1", f"Host: {authority}", "Accept-Encoding: identity"]
    for name, value in headers.items():
        value = str(value)
        if not _SAFE_VALUE.fullmatch(value) or not _SAFE_TARGET.fullmatch(name):
            raise ValueError(f"Invalid header {name[:64]!r}")
        lines.append(f"{name}: {value}")
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


class Connection(asyncio.Protocol):
    """One connection to an EHR and its exchanges, one at a time (`exchange`)."""

    def __init__(self):
        self.transport = None
        self.closed = False
        self.cut = False                 # the deadline closed it
        self.answered = False            # the current exchange's head was read
        self.reusable = False            # the current answer was read whole and the EHR keeps the connection
        self.unanswered_close = False    # closed by the EHR before a byte of the current answer
        self._waiter: asyncio.Future | None = None
        self._parser = None
        self._received = False

    # -- asyncio.Protocol ------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if self.answered and self._until_close:  # an answer without framing ends with its connection
            self._done(False)
            return
        self.unanswered_close = not self._received
        self._fail(exc or ConnectionResetError("The EHR closed the connection before its answer was whole."))

    def data_received(self, data: bytes) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():  # bytes nobody asked for: this connection is not reused
            self.close()
            return
        self._received = True
        try:
            self._parser.feed_data(data)
        except HttpError as exc:
            self._fail(exc)

    # -- llhttp's callbacks ----------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self._head[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.answered = True
        status = self._parser.get_status_code()
        head = self._head
        self._until_close = "content-length" not in head and "transfer-encoding" not in head
        try:
            self._limit = self._check(status, head)
        except BaseException as exc:  # the transport's check of the head (a bound): the exchange's error
            self._fail(exc)
            return
        if self._limit is None:  # no body wanted: the answer is its head, the connection not reused
            self._set((status, head, None))
            self.close()

    def on_body(self, body: bytes) -> None:
        if self._waiter.done():
            return
        self._size += len(body)
        self._chunks.append(body)
        if self._size > self._limit:  # past the transport's limit: read no further
            self._set((self._parser.get_status_code(), self._head, b"".join(self._chunks)))
            self.close()

    def on_message_complete(self) -> None:
        if not self._waiter.done():
            self._done(self._parser.should_keep_alive())

    # -- the exchange ----------------------------------------------------------------------------
    async def exchange(self, request: bytes, timeout: float, check):
        """Send `request`, read its answer: (status, `Head`, body bytes or None when `check(status,
        head)` -> the body's byte limit said None). Over at `timeout` seconds (the connection closed,
        `cut` set, TimeoutError). OSError or `HttpError` when the connection or the answer broke."""
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        self._parser = httptools.HttpResponseParser(self)
        self._head, self._chunks, self._size, self._check = Head(), [], 0, check
        self._limit, self._until_close = None, False
        self.answered = self.reusable = self.unanswered_close = self._received = False
        timer = loop.call_later(timeout, self._late)
        try:
            if self.closed:
                self.unanswered_close = True
                raise ConnectionResetError("The kept connection was closed.")
            self.transport.write(request)
            return await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def _late(self) -> None:
        self.cut = True
        self._fail(TimeoutError("The EHR's deadline passed."))
        self.close()

    def _done(self, keep: bool) -> None:
        self.reusable = keep and not self.closed
        self._set((self._parser.get_status_code(), self._head, b"".join(self._chunks)))

    def _set(self, value) -> None:
        if not self._waiter.done():
            self._waiter.set_result(value)

    def _fail(self, exc: BaseException) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.close()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()  # no lingering: nothing more is read or written on it
        self.closed = True


class AsyncConnections:
    """Idle kept-alive asyncio connections by origin, for the one IOLoop that uses them (a process's;
    when another loop takes one, the idle ones of the last are left to it)."""

    def __init__(self, per_origin: int = 8, context: ssl.SSLContext | None = None):
        self.per_origin = per_origin
        self.context = context or ssl.create_default_context()
        self._idle: dict[tuple, list[Connection]] = {}  # origins in the order of their last use
        self._loop = None  # the loop the idle connections belong to (another one's are left behind)

    async def take(self, origin: tuple[str, str, int], connect_timeout: float) -> tuple[Connection, bool]:
        """(a connection to `origin`, whether it was kept from an earlier request): an idle one still
        open, else a new one connected within `connect_timeout` (OSError, TimeoutError)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._idle = loop, {}
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            if not connection.closed:
                return connection, True
        scheme, host, port = origin
        secure = scheme == "https"
        _, connection = await asyncio.wait_for(loop.create_connection(
            Connection, host, port, ssl=self.context if secure else None, server_hostname=host if secure else None),
            connect_timeout)
        return connection, False

    def give_back(self, origin: tuple[str, str, int], connection: Connection, kept: bool) -> None:
        """Keep `connection` for the next request (`kept`: its answer read whole, still open), else close it."""
        if not kept or connection.closed:
            connection.close()
            return
        idle = self._idle.pop(origin, None)
        if idle is None:
            idle = []
            while len(self._idle) >= MAX_ORIGINS:
                for other in self._idle.pop(next(iter(self._idle))):
                    other.close()
        self._idle[origin] = idle  # most recently used last
        if len(idle) < self.per_origin:
            idle.append(connection)
        else:
            connection.close()
