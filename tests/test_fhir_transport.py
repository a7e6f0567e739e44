"""The EHR transport against real sockets (issue 36 item 7): an HTTP-date `Retry-After` is waited out
against the runtime's clock; a TLS certificate that does not verify is permanent (one attempt), a
TLS handshake broken off is transient (retried); the FHIR connector's `ExpiringCache` runs on the
runtime's clock and stays bounded. Each exchange test runs through both drivers of
`Transport`: the blocking one (`send`) and the IOLoop's (`send_async`, issue 46 item 7)."""
from __future__ import annotations

import asyncio
import email.utils
import socket
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from connectors.base import BoundExceeded, ConnectorError, ConnectorUnavailable, DeadlineExceeded
from connectors.bounds import Bounds
from connectors.fhir.cache import ExpiringCache
from connectors.fhir.transport import Transport
from models.clock import Clock

BOUNDS = Bounds("test", connect=2.0, request_deadline=30.0, max_bytes=1 << 20, max_pages=5, max_retry_after=20.0,
                attempts=3)


class QuietHandler(BaseHTTPRequestHandler):
    """An HTTP/1.1 handler that logs nothing: the base of the EHR doubles below."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass


class LoopbackEhr:
    """A `ThreadingHTTPServer` on a loopback port serving `handler`, its FHIR base `base`;
    `close()` stops it."""

    def serve(self, handler: type) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}/fhir"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class Busy(LoopbackEhr):
    """An EHR that answers 503 with `Retry-After: <header(clock)>` `busy` times, then 200 {}."""

    def __init__(self, header, busy: int = 1):
        self.header, self.busy, self.requests = header, busy, 0
        outer = self

        class Handler(QuietHandler):
            def do_GET(self):  # noqa: N802
                outer.requests += 1
                status, headers = (503, {"Retry-After": outer.header()}) if outer.requests <= outer.busy else (200, {})
                body = b"{}"
                self.send_response(status)
                for name, value in {**headers, "Content-Type": "application/fhir+json",
                                    "Content-Length": str(len(body))}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

        self.serve(Handler)


class Driver:
    """`Transport(...).send(...)` through one driver: `blocking` or `async` (one event loop for the
    test, so its kept connections outlive a request). Waits between attempts go to `waits`."""

    def __init__(self, kind: str):
        self.kind = kind
        self.loop = asyncio.new_event_loop() if kind == "async" else None

    def transport(self, base: str, bounds: Bounds = None, waits: list | None = None, **kwargs) -> Transport:
        waits = waits if waits is not None else []

        async def pause(seconds):
            waits.append(seconds)
        return Transport(base, bounds or BOUNDS, sleep=waits.append, pause=pause, **kwargs)

    def send(self, transport: Transport, method: str, url: str):
        if self.loop is None:
            return transport.send(method, url)
        return self.loop.run_until_complete(transport.send_async(method, url))

    def close(self):
        if self.loop is not None:
            self.loop.close()


@pytest.fixture(params=["blocking", "async"])
def driver(request):
    driver = Driver(request.param)
    yield driver
    driver.close()


def http_date(when: float) -> str:
    return email.utils.formatdate(when, usegmt=True)


@pytest.fixture
def clock_ahead():
    """The runtime's clock, an hour ahead of the machine's (as a test that moved it, or SVC_CLOCK_OFFSET)."""
    return Clock(offset_seconds=3600)


def test_an_http_date_retry_after_is_waited_out_against_the_runtime_clock(clock_ahead, driver):
    ehr = Busy(lambda: http_date(clock_ahead.time() + 7))
    waits: list[float] = []
    try:
        transport = driver.transport(ehr.base, waits=waits, wall=clock_ahead.time)
        status, body, _ = driver.send(transport, "GET", f"{ehr.base}/Patient/p1")
        assert (status, body) == (200, {})
        assert ehr.requests == 2
        assert len(waits) == 1 and 5.5 <= waits[0] <= 7.0, waits  # the date's second, not the 0.5 s default
    finally:
        ehr.close()


def test_a_retry_after_of_digits_that_are_not_ascii_is_unreadable(driver):
    """`Retry-After: ²` (a digit to `str.isdigit`, not to `float`) is an unreadable header: the
    default wait, then the retry, never an exception out of the transport."""
    ehr = Busy(lambda: "\u00b2")
    waits: list[float] = []
    try:
        status, body, _ = driver.send(driver.transport(ehr.base, waits=waits), "GET", f"{ehr.base}/Patient/p1")
        assert (status, body) == (200, {}) and ehr.requests == 2 and len(waits) == 1, waits
    finally:
        ehr.close()


def test_an_http_date_already_past_is_no_wait_and_one_too_far_ends_the_attempts(clock_ahead, driver):
    past = Busy(lambda: http_date(clock_ahead.time() - 60))
    waits: list[float] = []
    try:
        assert driver.send(driver.transport(past.base, waits=waits, wall=clock_ahead.time), "GET", past.base)[0] == 200
        assert waits == [0.0]
    finally:
        past.close()
    far = Busy(lambda: http_date(clock_ahead.time() + 600), busy=10)
    try:
        with pytest.raises(ConnectorUnavailable):
            driver.send(driver.transport(far.base, waits=waits, wall=clock_ahead.time), "GET", far.base)
        assert far.requests == 1, "a Retry-After past max_retry_after is not waited for"
    finally:
        far.close()


class KeptAlive(LoopbackEhr):
    """An HTTP/1.1 EHR counting the connections it accepts. Each answer is `{"n": <request number>}`,
    by `shape`: `length` (Content-Length), `chunked`, `alternate` (one then the other), `hang-up`
    (Content-Length, then the connection closed without a word, as a keep-alive timeout does) or
    `short` (a Content-Length the body never reaches before the connection closes)."""

    def __init__(self, shape: str):
        self.shape, self.requests, self.connections = shape, 0, 0
        outer = self

        class Handler(QuietHandler):
            disable_nagle_algorithm = True   # headers and body are two writes: no 40 ms wait between answers

            def setup(self):
                outer.connections += 1
                super().setup()

            def do_GET(self):  # noqa: N802
                outer.requests += 1
                body = b'{"n": %d}' % outer.requests
                chunked = outer.shape == "chunked" or (outer.shape == "alternate" and outer.requests % 2 == 0)
                self.send_response(200)
                self.send_header("Content-Type", "application/fhir+json")
                if chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
                    return
                self.send_header("Content-Length", str(len(body) + (100 if outer.shape == "short" else 0)))
                self.end_headers()
                self.wfile.write(body)
                if outer.shape in ("hang-up", "short"):
                    self.wfile.flush()
                    self.close_connection = True

        self.serve(Handler)


@pytest.mark.parametrize("shape", ["length", "chunked", "alternate"])
def test_one_connection_carries_request_after_request(shape, driver):
    """Issue 46 item 7: the EHR's connection is kept alive, whatever framing its answers use."""
    ehr, waits = KeptAlive(shape), []
    try:
        transport = driver.transport(ehr.base, waits=waits)
        answers = [driver.send(transport, "GET", f"{ehr.base}/Patient/p")[:2] for _ in range(6)]
        assert answers == [(200, {"n": n}) for n in range(1, 7)]
        assert ehr.connections == 1 and waits == []
    finally:
        ehr.close()


def test_a_kept_connection_the_ehr_closed_is_replaced_without_a_retry_or_a_wait(driver):
    ehr, waits = KeptAlive("hang-up"), []
    try:
        transport = driver.transport(ehr.base, waits=waits)
        answers = [driver.send(transport, "GET", f"{ehr.base}/Patient/p")[:2] for _ in range(4)]
        assert answers == [(200, {"n": n}) for n in range(1, 5)]
        assert ehr.requests == 4 and ehr.connections == 4 and waits == []
    finally:
        ehr.close()


def test_a_body_shorter_than_its_content_length_is_a_broken_answer_never_data(driver):
    ehr = KeptAlive("short")
    try:
        with pytest.raises(ConnectorUnavailable, match="broke off its answer"):
            driver.send(driver.transport(ehr.base), "GET", f"{ehr.base}/Patient/p")
    finally:
        ehr.close()


class TlsListener:
    """A TLS port on loopback counting the connections it accepts: with `certificate` it completes
    handshakes with that (self-signed) certificate; without, it hangs up during each handshake."""

    def __init__(self, certificate: tuple[str, str] | None):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.context = None
        if certificate:
            self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.context.load_cert_chain(*certificate)
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            if self.context is None:
                conn.recv(1024)  # the ClientHello, then hang up: a handshake broken off
                conn.close()
                continue
            try:
                self.context.wrap_socket(conn, server_side=True).close()
            except (ssl.SSLError, OSError):
                conn.close()  # the client refused our certificate

    def close(self):
        self.sock.close()


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory) -> tuple[str, str]:
    folder = tmp_path_factory.mktemp("tls")
    cert, key = str(folder / "cert.pem"), str(folder / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert],
                   check=True, capture_output=True)
    return cert, key


def test_a_certificate_that_does_not_verify_is_permanent_one_attempt(self_signed, driver):
    ehr = TlsListener(self_signed)
    waits: list[float] = []
    try:
        base = f"https://127.0.0.1:{ehr.port}/fhir"
        with pytest.raises(ConnectorError) as raised:
            driver.send(driver.transport(base, waits=waits), "GET", f"{base}/metadata")
        assert not isinstance(raised.value, ConnectorUnavailable), "permanent: retrying meets the same certificate"
        assert "TLS certificate that does not verify" in str(raised.value) and "certificate verify failed" in str(raised.value)
        assert ehr.accepted == 1 and waits == []
    finally:
        ehr.close()


def test_a_tls_handshake_broken_off_is_transient_and_retried(driver):
    ehr = TlsListener(None)
    waits: list[float] = []
    try:
        base = f"https://127.0.0.1:{ehr.port}/fhir"
        with pytest.raises(ConnectorUnavailable):
            driver.send(driver.transport(base, waits=waits), "GET", f"{base}/metadata")
        assert ehr.accepted == BOUNDS.attempts and len(waits) == BOUNDS.attempts - 1
    finally:
        ehr.close()


def test_the_expiring_cache_runs_on_the_runtime_clock(clock_ahead):
    cache = ExpiringCache(clock_ahead.time, margin=30)
    cache.put("token", "t1", expires_in=300)
    assert cache.get("token") == "t1"
    clock_ahead.advance(269)
    assert cache.get("token") == "t1"
    clock_ahead.advance(2)  # within the margin of its expiry, on the runtime's clock: renewed
    assert cache.get("token") is None


def test_the_expiring_cache_evicts_and_stays_bounded(clock_ahead):
    cache = ExpiringCache(clock_ahead.time, max_entries=100)
    for n in range(100):
        cache.put(("npi", n), f"pr-{n}", expires_in=60)
    clock_ahead.advance(61)  # all expired: the next put sweeps them
    cache.put("fresh", "v", expires_in=60)
    assert len(cache) == 1 and cache.get("fresh") == "v"
    for n in range(1000):  # none expired: the oldest go, the newest stay
        cache.put(("live", n), n, expires_in=3600)
        assert len(cache) <= 100
    assert cache.get(("live", 999)) == 999 and cache.get(("live", 0)) is None
    cache.put("short", "v", expires_in=1)
    clock_ahead.advance(2)
    assert cache.get("short") is None and len(cache) <= 100


class Hostile(LoopbackEhr):
    """An EHR answering every GET by `shape`: `redirect` (302 to another host), `declared` (a
    Content-Length past the limit), `endless` (a chunked body that never ends), `drip` (a byte every
    0.1 s), `slow-head` (no answer at all), `garbage` (not HTTP)."""

    def __init__(self, shape: str):
        self.shape, self.requests = shape, 0
        outer = self

        class Handler(QuietHandler):
            def do_GET(self):  # noqa: N802
                outer.requests += 1
                shape = outer.shape
                if shape == "garbage":
                    self.wfile.write(b"\x00\x01 not http at all\r\n\r\n")
                    return
                if shape == "slow-head":
                    threading.Event().wait(3)
                    return
                if shape == "redirect":
                    self.send_response(302)
                    self.send_header("Location", "http://evil.example/fhir/Patient/p")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/fhir+json")
                if shape in ("declared", "declared-digits"):
                    # declared-digits: more digits than Python's int() reads (4,300)
                    self.send_header("Content-Length", str(BOUNDS.max_bytes + 1) if shape == "declared" else "9" * 5000)
                    self.end_headers()
                    self.wfile.write(b"{" * 1024)
                    return
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    while True:
                        piece = b" " * (64 * 1024 if shape == "endless" else 1)
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                        self.wfile.flush()
                        if shape == "drip":
                            threading.Event().wait(0.1)
                except OSError:
                    return

        self.serve(Handler)


@pytest.mark.parametrize("shape, error, bound", [("redirect", BoundExceeded, "redirect"),
                                                 ("declared", BoundExceeded, "max_bytes"),
                                                 ("endless", BoundExceeded, "max_bytes"),
                                                 ("drip", DeadlineExceeded, "deadline"),
                                                 ("slow-head", DeadlineExceeded, "deadline")])
def test_every_bound_holds_on_both_drivers(shape, error, bound, driver):
    """Issue 46 item 7: the IOLoop's driver is held to the bounds the blocking one is (a redirect
    not followed, the size limit declared or streamed, the deadline over head and body alike)."""
    ehr = Hostile(shape)
    short = Bounds("test", connect=2.0, request_deadline=1.0, max_bytes=1 << 20, max_pages=5, max_retry_after=20.0,
                   attempts=3)
    try:
        started = time.monotonic()
        with pytest.raises(error) as raised:
            driver.send(driver.transport(ehr.base, short), "GET", f"{ehr.base}/Patient/p")
        assert raised.value.bound == bound and time.monotonic() - started < 2.5
        assert ehr.requests == 1
    finally:
        ehr.close()


def test_a_content_length_of_5000_digits_is_the_ehrs_error_not_ours(driver):
    """A hostile EHR's Content-Length of 5,000 digits: past the size limit on the blocking driver
    (it was a bare ValueError from int(), a 500), not HTTP to llhttp on the loop's; an EHR's error
    either way, never an exception of ours."""
    ehr = Hostile("declared-digits")
    try:
        with pytest.raises(ConnectorError) as raised:
            driver.send(driver.transport(ehr.base), "GET", f"{ehr.base}/Patient/p")
        if driver.kind == "blocking":
            assert isinstance(raised.value, BoundExceeded) and raised.value.bound == "max_bytes"
    finally:
        ehr.close()


def test_an_answer_that_is_not_http_is_transient_and_retried(driver):
    ehr, waits = Hostile("garbage"), []
    try:
        with pytest.raises(ConnectorUnavailable):
            driver.send(driver.transport(ehr.base, waits=waits), "GET", f"{ehr.base}/Patient/p")
        assert ehr.requests == BOUNDS.attempts and len(waits) == BOUNDS.attempts - 1
    finally:
        ehr.close()
