"""serve's HTTP/1.1 server connection: llhttp (`httptools`) parsing under Tornado's Application.

`HttptoolsServer` takes the sockets `BalancedAcceptor` accepts and serves each as a
`HttptoolsConnection`, an asyncio `Protocol` on the loop's own transport. The connection implements
Tornado's public `httputil.HTTPConnection` and hands every request to the application through
`HTTPServerConnectionDelegate.start_request` / `HTTPMessageDelegate`, exactly as Tornado's
`HTTP1ServerConnection` does over an `IOStream`, for less CPU per request (BENCHMARKS.md, issue 49).
`SVC_HTTP_CONNECTION=tornado` keeps Tornado's own connection (`ops.balance.CountingHTTPServer`).

What it guarantees (docs/security.md): requests are parsed by llhttp in strict mode (a request with
both Content-Length and Transfer-Encoding, two Content-Lengths, a bad chunk size, a NUL or bare CR in
a header, and what Tornado's HTTPServerRequest refuses: a missing, repeated or invalid Host, too many
query arguments: 400 and the connection closed); headers above `max_header_size` bytes: 431 and closed; a
declared body above `max_body_size`: 413 before it is read, a chunked one that grows past it: 413
and closed. Pipelined requests are answered in order, one at a time; reading pauses while the
requests waiting behind the current one hold more than PIPELINE_BYTES, and the next request waits
(reading paused) while the transport holds more than its high-water mark of responses the client has
not read, as Tornado's connection waits for its pending write. A response is chunked when its
handler flushes before finishing; a flush resolves once the transport's buffer is below its
high-water mark (back-pressure). Keep-alive, HTTP/1.0, `Connection: close`, `Expect: 100-continue`,
HEAD and 1xx/204/304 follow Tornado's HTTP1Connection. Once the server drains (SIGTERM), every
response says `Connection: close` and its connection closes after it; a connection idle between
requests (no byte of a next one read, none waiting in the kernel) is half-closed at once (a FIN:
a request crossing it is the client's to retry on another connection, never a reset).
"""
from __future__ import annotations

import asyncio
import collections
import fcntl
import logging
import socket
import struct
import termios

import httptools
from tornado import httputil, iostream
from tornado.concurrent import Future

from ops.idle import HeaderWaits

log = logging.getLogger("svc_auth.http")

MAX_HEADER_SIZE = 65536
"""Bytes of a request's start line and headers (Tornado's default max_header_size)."""

PIPELINE_BYTES = 65536
"""Reading pauses while the requests queued behind the current one hold more than this."""

WRITE_HIGH_WATER = 65536
"""A flush waits while the transport holds more than this (asyncio's pause_writing)."""

CLOSE_SECONDS = 2.0
"""At the end of a drain, how long a closing connection may take to send what it holds."""

_BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
_REASONS = ((413, b"Payload Too Large"), (431, b"Request Header Fields Too Large"))


class _Context:
    """What `HTTPServerRequest` reads from `connection.context` (xheaders off: the socket's peer)."""

    __slots__ = ("remote_ip", "protocol", "address", "trusted_downstream")

    def __init__(self, peer):
        self.address = peer
        self.remote_ip = peer[0] if isinstance(peer, tuple) and peer else "0.0.0.0"
        self.protocol = "http"
        self.trusted_downstream = None

    def __str__(self) -> str:
        return self.remote_ip


class _Message:
    """One request as parsed: its head, its body chunks not yet handed on, whether it is all in."""

    __slots__ = ("url", "fields", "start_line", "headers", "chunks", "queued_bytes", "head_bytes",
                 "head_fed", "body_bytes", "complete", "error")

    def __init__(self):
        self.url = b""
        self.fields: list = []  # [name, value] pairs as bytes
        self.start_line = self.headers = None
        self.chunks: list = []
        self.queued_bytes = self.head_bytes = self.head_fed = self.body_bytes = 0
        self.complete = False
        self.error = 0  # 400/413/431: answer this and close once it is this message's turn


class HttptoolsConnection(asyncio.Protocol, httputil.HTTPConnection):
    """One client connection: requests parsed by llhttp, run by the application one at a time."""

    def __init__(self, server: "HttptoolsServer"):
        self.server = server
        self.transport = None
        self.context = None
        self.parser = httptools.HttpRequestParser(self)
        self.incoming: _Message | None = None  # the message the parser is filling
        self.queue: collections.deque = collections.deque()  # parsed or parsing, not yet current
        self.current: _Message | None = None  # the request the application has
        self.delegate = None
        self.delivered_head = self.expect_continue = False
        self.waiting = False  # the delegate asked us to wait (a future from headers_received/data_received)
        self.read_finished = self.write_finished = True
        self.disconnect_on_finish = False
        self.chunking_output = False
        self.expected_remaining = None
        self.close_callback = None
        self.reading_paused = self.writing_paused = False
        self.drain_waiters: list = []
        self.closed = False
        self.closing = False
        self.held = False  # the next request waits for the client to read what was written
        loop = asyncio.get_running_loop()
        self.lost = loop.create_future()
        # What every write returns while the transport takes more: one done future for the
        # connection's life, not a new one per write (nothing sets or cancels a done future).
        self.sent = loop.create_future()
        self.sent.set_result(None)

    # -- asyncio.Protocol ------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self.context = _Context(transport.get_extra_info("peername"))
        self.server.connection_made(self)
        self.server.header_waits.since[self] = self.server.header_waits.clock()
        if self.server.draining:
            self.drain()  # accepted just before the drain: served only if its request is arriving

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        heading = self.incoming if self.incoming is not None and self.incoming.headers is None else None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # An Upgrade request: served as a plain request (nothing here upgrades), then closed.
            if self.incoming is not None and self.incoming.headers is not None:
                self.incoming.complete = True
            self._stop_parsing(0)
        except httptools.HttpParserError as exc:
            cause = exc.__context__
            self._stop_parsing(cause.status if isinstance(cause, _TooLarge) else 400)
        else:
            if heading is not None and heading is self.incoming and heading.headers is None:
                # Headers still incomplete: llhttp holds an unfinished line whole, so count what
                # came while they did (a single endless header line is refused too).
                heading.head_fed += len(data)
                if heading.head_fed > self.server.max_header_size:
                    self._stop_parsing(431)
        self._pump()
        if not self.reading_paused and not self.closing and self._queued_bytes() > PIPELINE_BYTES:
            self.reading_paused = True
            self.transport.pause_reading()

    def eof_received(self):
        return False  # close our side too (an unfinished request is told on_connection_close)

    def connection_lost(self, exc) -> None:
        self.closed = self.closing = True
        self.server.header_waits.since.pop(self, None)
        if self.current is not None:
            if not self.read_finished and self.delegate is not None:
                self.read_finished = True
                try:
                    self.delegate.on_connection_close()
                except Exception:
                    log.exception("error in on_connection_close")
            self._run_close_callback()
        self.current = None
        self._release_writers(iostream.StreamClosedError())
        if not self.lost.done():
            self.lost.set_result(None)
        self.server.connection_lost(self)

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._release_writers(None)
        if self.held and not self.closed:
            self.held = False
            self._pump()
            self._resume_reading_if_room()

    # -- httptools callbacks (they only record; _pump hands on) -----------------------------------
    def on_message_begin(self) -> None:
        self.incoming = _Message()
        self.queue.append(self.incoming)

    def on_url(self, url: bytes) -> None:
        message = self.incoming
        message.url += url
        message.head_bytes += len(url)
        if message.head_bytes > self.server.max_header_size:
            raise _TooLarge(431)

    def on_header(self, name: bytes, value: bytes) -> None:
        message = self.incoming
        if message.headers is not None:
            return  # a chunked body's trailer: ignored, as Tornado does
        message.fields.append((name, value))
        message.head_bytes += len(name) + len(value) + 4
        if message.head_bytes > self.server.max_header_size:
            raise _TooLarge(431)

    def on_headers_complete(self) -> None:
        message, parser = self.incoming, self.parser
        method = parser.get_method().decode("latin1")
        version = "HTTP/" + parser.get_http_version()
        message.start_line = httputil.RequestStartLine(method, message.url.decode("latin1"), version)
        headers = httputil.HTTPHeaders()
        for name, value in message.fields:  # a value without its surrounding whitespace (RFC 9110 5.5 OWS),
            headers.add(name.decode("latin1"), value.strip(b" \t").decode("latin1"))  # as Tornado's parser gives it
        message.headers, message.fields = headers, None
        length = headers.get("Content-Length")
        if length is not None and length.isascii() and length.isdigit() and int(length) > self.server.max_body_size:
            raise _TooLarge(413)  # before one byte of it is read

    def on_body(self, body: bytes) -> None:
        message = self.incoming
        message.body_bytes += len(body)
        if message.body_bytes > self.server.max_body_size:
            raise _TooLarge(413)
        message.chunks.append(body)
        message.queued_bytes += len(body)

    def on_message_complete(self) -> None:
        self.incoming.complete = True
        self.incoming = None

    # -- hand requests to the application, one at a time ---------------------------------------
    def _stop_parsing(self, status: int) -> None:
        """The parser failed (or was told to stop): no more requests from this connection."""
        message = self.incoming
        if status:
            if message is None or message.complete:
                message = _Message()
                self.queue.append(message)
            message.error = status
            message.complete = True
        self.incoming = None
        self.closing = True  # read no further; the queue before the error is still answered
        if self.reading_paused is False:
            self.reading_paused = True
            self.transport.pause_reading()

    def _hold(self) -> None:
        """Responses the client has not read fill the transport: no next request, no reading, until
        `resume_writing` (else a client pipelining requests it never reads grows the buffer without end)."""
        self.held = True
        if not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()

    def _resume_reading_if_room(self) -> None:
        if (self.reading_paused and not self.closing and not self.held
                and self._queued_bytes() <= PIPELINE_BYTES):
            self.reading_paused = False
            self.transport.resume_reading()

    def _queued_bytes(self) -> int:
        current = self.current.queued_bytes if self.current is not None else 0
        return current + sum(m.queued_bytes + m.head_bytes for m in self.queue)

    def _pump(self) -> None:
        """Start the next request if none runs; hand the current one what has arrived of it."""
        while True:
            if self.current is None:
                if not self.queue or self.closed:
                    return
                if self.writing_paused:
                    self._hold()
                    return
                message = self.queue[0]
                if message.error:
                    self._answer_error(message.error)
                    return
                if message.headers is None:
                    return  # its headers are still coming
                self.queue.popleft()
                self._begin(message)
            if self.waiting or self.current is None:
                return
            message = self.current
            if not self.delivered_head:
                self.delivered_head = True
                self.expect_continue = _optional(message.headers, "Expect") == "100-continue"
                if not self._call(self.delegate.headers_received, message.start_line, message.headers):
                    return
                continue
            if self.expect_continue:
                self.expect_continue = False
                if not self.write_finished and not self.closed:
                    self.transport.write(b"HTTP/1.1 100 (Continue)\r\n\r\n")
            if message.error and not self.read_finished:
                self._fail_current(message.error)
                return
            if message.chunks:
                chunks, message.chunks, message.queued_bytes = message.chunks, [], 0
                self._resume_reading_if_room()
                for i, chunk in enumerate(chunks):
                    if self.write_finished:
                        continue  # answered already: the rest of the body is read and dropped
                    if not self._call(self.delegate.data_received, chunk):
                        message.chunks = chunks[i + 1:]
                        message.queued_bytes = sum(map(len, message.chunks))
                        return
                continue
            if message.complete and not self.read_finished:
                self.read_finished = True
                if not self.write_finished:
                    try:
                        self.delegate.finish()
                    except Exception:
                        log.exception("error in the request's finish")
                        self._abort()
                        return
                else:
                    self._end_message()
                continue
            return

    def _call(self, method, *args) -> bool:
        """Call a delegate method; False if it returned a future to wait for (resumed when done)."""
        try:
            result = method(*args)
        except httputil.HTTPInputError as exc:
            self._malformed(exc)
            return False
        except Exception:
            log.exception("error in the request's delegate")
            self._abort()
            return False
        if result is not None and not (isinstance(result, Future) and result.done()):
            self.waiting = True

            def resume(_):
                self.waiting = False
                self._pump()

            asyncio.ensure_future(result).add_done_callback(resume)
            return False
        return True

    def _begin(self, message: _Message) -> None:
        self.server.header_waits.since.pop(self, None)
        self.current, self.delivered_head, self.waiting = message, False, False
        self._resume_reading_if_room()
        self.read_finished = self.write_finished = False
        self.chunking_output, self.expected_remaining, self.close_callback = False, None, None
        self.disconnect_on_finish = self.server.draining or not self._can_keep_alive(message)
        self.delegate = self.server.start_request(self)

    @staticmethod
    def _can_keep_alive(message: _Message) -> bool:
        """Tornado's HTTP1Connection._can_keep_alive, for a request."""
        start_line, headers = message.start_line, message.headers
        connection = _optional(headers, "Connection")
        if connection is not None:
            connection = connection.lower()
        if start_line.version == "HTTP/1.1":
            return connection != "close"
        if ("Content-Length" in headers or "chunked" in headers.get("Transfer-Encoding", "").lower()
                or start_line.method in ("HEAD", "GET")):
            return connection == "keep-alive"
        return False

    def _end_message(self) -> None:
        """The current request is read and answered: close, or wait for the next one."""
        self.current = self.delegate = None
        self.close_callback = None
        if self.disconnect_on_finish or self.closing and not self.queue:
            self.close()
            return
        if self.server.draining:
            self.close()
            return
        if not self.queue or self.queue[0].headers is None:
            self.server.header_waits.since[self] = self.server.header_waits.clock()
        self._pump()

    def _answer_error(self, status: int) -> None:
        if not self.closed:
            reason = next((text for code, text in _REASONS if code == status), None)
            self.transport.write(_BAD_REQUEST if reason is None else
                                 b"HTTP/1.1 %d %s\r\nConnection: close\r\nContent-Length: 0\r\n\r\n" % (status, reason))
        self.close()

    def _malformed(self, exc: httputil.HTTPInputError) -> None:
        """Tornado refused the request (HTTPServerRequest: a missing, repeated or invalid Host, too
        many query arguments): 400 and close, logged at INFO, as its HTTP1Connection does."""
        log.info("Malformed HTTP request from %s: %s", self.context, exc)
        self._fail_current(400)

    def _fail_current(self, status: int) -> None:
        """The current request's body broke the rules mid-way: tell its delegate, answer, close."""
        self.read_finished = True
        try:
            self.delegate.on_connection_close()
        except Exception:
            log.exception("error in on_connection_close")
        if self.chunking_output or self.expected_remaining is not None or self.write_finished:
            self.close()  # a response began: nothing can be said in it
        else:
            self.write_finished = True
            self._answer_error(status)

    def drain(self) -> None:
        """The server drains: close now if idle; a request under way is answered, then closed."""
        if self.closed or self.closing or self.current is not None or self.queue or self._unread():
            return
        self.closing = True  # what the client sends from now on is read and dropped
        self.transport.write_eof()  # a FIN, not a close: a request crossing it meets an EOF, not a reset

    def serving(self) -> bool:
        """A request under way or begun (the drain waits for it); False once closing between requests."""
        return not self.closed and not (self.closing and self.current is None)

    def _unread(self) -> int:
        """Bytes the kernel holds that the transport has not read yet (a request just arriving)."""
        sock = self.transport.get_extra_info("socket")
        try:
            return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
        except (AttributeError, OSError):
            return 0

    def _abort(self) -> None:
        if not self.closed:
            self.transport.abort()

    def close(self) -> None:
        """Close the connection (the idle sweep, draining, Connection: close): what is written is sent."""
        if not self.closed and self.transport is not None:
            self.closing = True
            self.transport.close()

    # -- httputil.HTTPConnection ---------------------------------------------------------------
    def set_close_callback(self, callback) -> None:
        self.close_callback = callback

    def _run_close_callback(self) -> None:
        callback, self.close_callback = self.close_callback, None
        if callback is not None:
            try:
                callback()
            except Exception:
                log.exception("error in the close callback")

    def write_headers(self, start_line, headers, chunk=None) -> Future:
        if self.closed or self.current is None:
            return self._send(b"")
        request = self.current.start_line
        code = start_line.code
        self.chunking_output = (request.version == "HTTP/1.1" and request.method != "HEAD"
                                and code not in (204, 304) and not 100 <= code < 200
                                and "Content-Length" not in headers)
        if self.server.draining:
            self.disconnect_on_finish = True  # begun before the drain, answered after it
        if request.version == "HTTP/1.1" and self.disconnect_on_finish:
            headers["Connection"] = "close"
        if request.version == "HTTP/1.0" and self.current.headers.get("Connection", "").lower() == "keep-alive":
            headers["Connection"] = "Keep-Alive"
        if self.chunking_output:
            headers["Transfer-Encoding"] = "chunked"
        if request.method == "HEAD" or code == 304:
            self.expected_remaining = 0
        elif "Content-Length" in headers:
            self.expected_remaining = int(headers["Content-Length"])
        else:
            self.expected_remaining = None
            if not self.chunking_output and code not in (204, 304) and not 100 <= code < 200:
                self.disconnect_on_finish = True  # HTTP/1.0 without a length: the close ends the body
        lines = [f"HTTP/1.1 {code} {start_line.reason}"]
        lines += [f"{name}: {value}" for name, value in headers.get_all()]
        text = "\r\n".join(lines)  # one scan for CR or LF in all of them: only the joins' may be there
        if text.count("\r") != len(lines) - 1 or text.count("\n") != len(lines) - 1:
            line = next(line for line in lines if "\r" in line or "\n" in line)
            raise ValueError("Illegal characters (CR or LF) in header: %r" % line.encode("latin1", "replace"))
        data = (text + "\r\n\r\n").encode("latin1")
        if chunk:
            data += self._body(chunk)
        return self._send(data)

    def write(self, chunk: bytes) -> Future:
        return self._send(self._body(chunk))

    def _body(self, chunk: bytes) -> bytes:
        if self.expected_remaining is not None:
            self.expected_remaining -= len(chunk)
            if self.expected_remaining < 0:
                self._abort()
                raise httputil.HTTPOutputError("Tried to write more data than Content-Length")
        if self.chunking_output and chunk:
            return b"%x\r\n%s\r\n" % (len(chunk), chunk)
        return chunk

    def _send(self, data: bytes) -> Future:
        if self.closed:
            future = Future()
            future.set_exception(iostream.StreamClosedError())
            future.exception()
            return future
        if data:
            self.transport.write(data)
        if not self.writing_paused:
            return self.sent
        future = Future()
        self.drain_waiters.append(future)
        return future

    def _release_writers(self, error) -> None:
        waiters, self.drain_waiters = self.drain_waiters, []
        for future in waiters:
            if not future.done():
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)
                    future.exception()

    def finish(self) -> None:
        if self.expected_remaining is not None and self.expected_remaining != 0 and not self.closed:
            self._abort()
            raise httputil.HTTPOutputError(f"Tried to write {self.expected_remaining} bytes less than Content-Length")
        if self.chunking_output and not self.closed:
            self.transport.write(b"0\r\n\r\n")
        self.write_finished = True
        self.close_callback = None
        if self.current is None:
            return
        if not self.read_finished:
            # Answered before the whole body came (Tornado does the same): read it and drop it,
            # unless the client waits for a 100 Continue it will never get.
            if self.current.headers.get("Expect") == "100-continue":
                self.disconnect_on_finish = True
            if self.disconnect_on_finish:
                self.close()
            return
        self._end_message()


def _optional(headers: httputil.HTTPHeaders, name: str) -> str | None:
    """`headers.get(name)` for a header most requests lack (its `get` raises and catches a KeyError then)."""
    return headers[name] if name in headers else None


class _TooLarge(Exception):
    """Raised from a parser callback: the request breaks a limit (its status)."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


class HttptoolsServer:
    """The connections of one serve process: counts them into the balancer's Slot, sweeps the
    ones waiting too long for headers (`ops.idle`), and drains them on SIGTERM."""

    def __init__(self, app, slot, idle_connection_timeout: float = 3600, max_body_size: int = 100 * 1024 * 1024,
                 max_header_size: int = MAX_HEADER_SIZE):
        self.app, self.slot = app, slot
        self.max_body_size, self.max_header_size = max_body_size, max_header_size
        self.connections: set = set()
        self.draining = False
        self.header_waits = HeaderWaits(idle_connection_timeout)
        self.header_waits.start()

    def handle_socket(self, sock: socket.socket, address) -> None:
        """An accepted socket: counted now, served by a connection on the running loop."""
        self.slot.opened()
        loop = asyncio.get_running_loop()
        task = loop.create_task(loop.connect_accepted_socket(lambda: HttptoolsConnection(self), sock))
        task.add_done_callback(self._check_connect)

    def _check_connect(self, task) -> None:
        if task.cancelled() or task.exception() is not None:
            if not task.cancelled():
                log.info("could not serve an accepted connection: %s", task.exception())
            self.slot.closed()
            self.on_connection_closed()

    def start_request(self, connection: HttptoolsConnection):
        return self.app.start_request(self, connection)

    def connection_made(self, connection: HttptoolsConnection) -> None:
        self.connections.add(connection)

    def connection_lost(self, connection: HttptoolsConnection) -> None:
        if connection in self.connections:
            self.connections.discard(connection)
            self.slot.closed()
            self.on_connection_closed()

    def start_draining(self) -> None:
        """SIGTERM: every response from now on closes its connection; idle connections close now."""
        self.draining = True
        for connection in list(self.connections):
            connection.drain()

    def busy(self) -> bool:
        """Whether a connection still has a request to answer (serve's drain waits for it)."""
        return any(connection.serving() for connection in self.connections)

    async def close_all_connections(self) -> None:
        """Close every connection (after serve has let in-flight requests finish) and wait for them."""
        self.draining = True
        self.header_waits.stop()
        connections = list(self.connections)
        for connection in connections:
            connection.close()  # what is written is still sent...
        if connections:
            await asyncio.wait([c.lost for c in connections], timeout=CLOSE_SECONDS)
        for connection in connections:
            if not connection.lost.done():
                connection.transport.abort()  # ...unless its client stopped reading it
                await connection.lost

    def on_connection_closed(self) -> None:
        """Replaced by the `BalancedAcceptor` serving this server."""
