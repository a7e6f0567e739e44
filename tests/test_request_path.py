"""The framework's per-request floor (issue 37): literal routes by lookup, log lines written once
per IOLoop turn, Nagle off once per connection, idle connections closed by a sweep, and that
none changes what a request gets or what the log says."""
from __future__ import annotations

import asyncio
import io
import json
import logging
import socket
import threading
import time

import pytest
import tornado.httputil
import tornado.netutil
import tornado.web

from conf.logging import AccessRecord, JsonFormatter, JsonLineHandler, sole_json_handler
from ops.balance import BalancedAcceptor, ConnectionCounts, CountingHTTPServer, Slot
from ops.logwrites import LoopBatchedStream, batch_log_writes
from ops.observability import ObservedApplication
from ops.routing import exact_routes, first_segment, literal_path
from helpers.processes import free_port, settings_env, start_process, stop_process
from server import make_app


def request_for(path: str) -> tornado.httputil.HTTPServerRequest:
    return tornado.httputil.HTTPServerRequest(
        start_line=tornado.httputil.RequestStartLine("GET", path, "HTTP/1.1"),
        headers=tornado.httputil.HTTPHeaders({"Host": "127.0.0.1"}))


def test_literal_path_only_for_patterns_without_regex_syntax():
    assert literal_path("/healthz$") == "/healthz"
    assert literal_path(r"/\.well-known/jwks\.json$") == "/.well-known/jwks.json"
    for pattern in (r"/v1/apps/([^/]+)$", r"/static/(.*)$", r"/fhir/\d+$", "/v1/oauth/token", r"/a\$"[:-1]):
        assert literal_path(pattern) is None, pattern


def test_every_literal_route_is_the_rule_tornados_order_picks(runtime):
    app = make_app(runtime)
    assert "/healthz" in app.exact_routes and "/v1/oauth/token" in app.exact_routes
    for path in app.exact_routes:
        ordered = tornado.web.Application.find_handler(app, request_for(path))
        looked_up = app.find_handler(request_for(path))
        looked_up, ordered = looked_up.delegate, ordered.delegate  # Tornado's own, inside the in-flight count
        assert (looked_up.handler_class, looked_up.handler_kwargs) == (ordered.handler_class, ordered.handler_kwargs)


def test_first_segments_only_where_every_match_starts_with_them():
    assert first_segment(r"/fhir/r4/([^/]+)/([^/]+)$") == "fhir"
    assert first_segment("/healthz$") == "healthz"
    assert first_segment(r"/\.well-known/jwks\.json$") == ".well-known"
    for pattern in ("/(.*)$", ".*$", "/$", "/fhirs?/x$", "/a/?x$", r"/a\d/x$", "/ab*$", "/a(b)/c$"):
        assert first_segment(pattern) is None, pattern


def test_every_path_is_routed_as_tornados_order_routes_it(runtime):
    """The first-segment tables (`ops.routing.segment_routes`) pick the rule, and its path
    arguments, that Tornado's in-order matching picks, for every kind of path the API serves."""
    app = make_app(runtime)
    paths = ["/fhir/r4/org_1/Patient/pat-1", "/fhir/r4/org_1/Observation", "/fhir/r4/org_1/metadata",
             "/fhir/r4/org_1/.well-known/smart-configuration", "/fhir/r4/org_1/a/b/c", "/fhir/r4",
             "/v1/apps/app_1", "/v1/organizations/org_1/users", "/os-api/v2/apps/x", "/static/app.js",
             "/console/", "/.well-known/openid-configuration", "/nothing/here", "/", "/%66hir/r4/o/Patient",
             "/fhir//Patient/1", "/healthz/", "/v1/oauth/authorize", "/robots.txt", "/console", "/console/apps"]
    assert app.segment_routes is not None and len(app.segment_routes["fhir"]) < len(app.wildcard_router.rules) / 4
    assert app.segment_routes["fhir"].one_regex
    for path in paths:
        ours, tornados = app.find_handler(request_for(path)).delegate, \
            tornado.web.Application.find_handler(app, request_for(path)).delegate
        assert (ours.handler_class, ours.handler_kwargs, ours.path_args, ours.path_kwargs) == \
            (tornados.handler_class, tornados.handler_kwargs, tornados.path_args, tornados.path_kwargs), path


class First(tornado.web.RequestHandler):
    def get(self):
        self.finish("first")


class Second(tornado.web.RequestHandler):
    def get(self):
        self.finish("second")


def test_a_rule_table_picks_tornados_rule_and_arguments_as_one_regex_or_one_by_one():
    """`ops.routing.RuleTable`: the first rule in order that matches, with the path arguments
    Tornado gives (unescaped bytes, None for a group that did not match), whether its rules are
    tried as one regex or, when one regex cannot hold them (a back-reference), one by one."""
    tables = {"one regex": [(r"/a/(x)?(\d+)", First), (r"/a/(.*)", Second), (r"/a/b", First)],
              "one by one": [(r"/a/(x)?(\d+)", First), (r"/a/(.*)", Second), (r"/a/(\w)\1", First)]}
    paths = ["/a/x12", "/a/12", "/a/b", "/a/%41b%2F", "/a/%C3%A9", "/a/%ff", "/a/zz", "/a/", "/b", "/a/x"]
    for kind, rules in tables.items():
        app = ObservedApplication(rules, log_function=lambda h: None)
        table = app.segment_routes["a"]
        assert table.one_regex is (kind == "one regex")
        for path in paths:
            ours = app.find_handler(request_for(path)).delegate
            tornados = tornado.web.Application.find_handler(app, request_for(path)).delegate
            assert (ours.handler_class, ours.path_args, ours.path_kwargs) == \
                (tornados.handler_class, tornados.path_args, tornados.path_kwargs), (kind, path)


def test_a_literal_path_an_earlier_pattern_matches_is_left_to_tornado():
    app = ObservedApplication([(r"/a/.*", First), (r"/a/b", Second), (r"/c", Second)], log_function=lambda h: None)
    assert set(app.exact_routes) == {"/c"}
    assert app.find_handler(request_for("/a/b")).delegate.handler_class is First
    assert app.find_handler(request_for("/c")).delegate.handler_class is Second
    assert exact_routes([]) == {}


@pytest.mark.gen_test
async def test_literal_and_pattern_routes_answer_over_http(api, world):
    assert (await api.call("GET", "/healthz"))[0] == 200
    status, _, body = await api.call("GET", "/.well-known/jwks.json")
    assert status == 200 and body["keys"]
    assert (await api.call("GET", "/healthz/"))[0] == 404  # not a literal route: Tornado's routing, as before


class Recording:
    """A stream that records each write and flush it gets."""

    def __init__(self):
        self.writes: list[str] = []
        self.flushes = 0

    def write(self, text):
        self.writes.append(text)

    def flush(self):
        self.flushes += 1


def json_handler(stream) -> logging.StreamHandler:
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler._svc_json = True
    return handler


def test_lines_logged_in_one_loop_turn_are_one_write_and_other_threads_write_at_once():
    recording = Recording()
    handler = json_handler(recording)
    log = logging.getLogger("svc_auth.test_batched")
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.INFO)
    loop = asyncio.new_event_loop()
    try:
        handler.setStream(LoopBatchedStream(recording, loop))

        async def one_turn():
            for number in range(3):
                log.info("line %d", number)
            assert recording.writes == []  # still this turn
            await asyncio.sleep(0)  # the scheduled write runs before we resume
            await asyncio.sleep(0)
            assert len(recording.writes) == 1
            lines = [json.loads(line) for line in recording.writes[0].splitlines()]
            assert [line["message"] for line in lines] == ["line 0", "line 1", "line 2"]
            log.info("pending")
            thread = threading.Thread(target=log.info, args=("from a thread",))
            thread.start()
            thread.join()
            # The thread's line is written at once, after the line pending from the loop's thread.
            assert [json.loads(line)["message"] for line in recording.writes[1].splitlines()] == [
                "pending", "from a thread"]

        loop.run_until_complete(one_turn())
    finally:
        loop.close()
        log.removeHandler(handler)


def test_restoring_writes_what_is_pending_and_gives_the_stream_back():
    recording = Recording()
    handler = json_handler(recording)
    root = logging.getLogger()
    root.addHandler(handler)
    loop = asyncio.new_event_loop()
    try:
        async def run():
            restore = batch_log_writes(asyncio.get_running_loop())
            assert isinstance(handler.stream, LoopBatchedStream)
            logging.getLogger("svc_auth.test_restore").warning("last words")
            restore()  # before the loop turn ends
            assert handler.stream is recording
            assert any("last words" in text for text in recording.writes)

        loop.run_until_complete(run())
    finally:
        loop.close()
        root.removeHandler(handler)


class NoDelayReport(tornado.web.RequestHandler):
    async def get(self):
        sock = self.request.connection.stream.socket
        self.finish(str(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0))


def test_an_accepted_connection_keeps_nagle_off_for_every_request():
    """TCP_NODELAY is set once when a connection is accepted and stays on (Tornado's toggling
    per request, two setsockopt calls, is skipped): seen from the handler, request after request."""
    loop = asyncio.new_event_loop()
    listener = tornado.netutil.bind_sockets(0, "127.0.0.1")
    port = listener[0].getsockname()[1]

    async def run():
        server = CountingHTTPServer(tornado.web.Application([(r"/nodelay", NoDelayReport)]),
                                    slot=Slot(ConnectionCounts(1), 0))
        acceptor = BalancedAcceptor(server, listener)
        acceptor.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            answers = []
            for _ in range(3):  # one keep-alive connection
                writer.write(b"GET /nodelay HTTP/1.1\r\nHost: x\r\n\r\n")
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                answers.append(await reader.readexactly(length))
            writer.close()
            assert answers == [b"True"] * 3
        finally:
            acceptor.stop()
            await server.close_all_connections()

    try:
        loop.run_until_complete(run())
    finally:
        loop.close()


def _closed_after(sock: socket.socket, started: float, timeout: float = 6.0) -> float:
    """Seconds from `started` until the server closes `sock` (reads what it sends meanwhile)."""
    sock.settimeout(timeout)
    while sock.recv(65536):
        pass
    return time.monotonic() - started


@pytest.mark.parametrize("connection", ["httptools", "tornado"])
def test_a_connection_that_keeps_serve_waiting_for_headers_past_the_idle_limit_is_closed(settings, tmp_path, connection):
    """SVC_IDLE_CONNECTION_TIMEOUT bounds the wait for a request's headers (Tornado's own timer,
    armed around every request, is replaced by one sweep): a silent connection, one that sends
    its headers a line at a time without ending them, and a keep-alive connection idle after its
    answer are each closed within the limit and a sweep; a request whose headers came and whose
    body is slow is answered, not swept."""
    port = free_port()
    issuer = f"http://127.0.0.1:{port}"
    env = settings_env(settings, SVC_ISSUER=issuer, SVC_PUBLIC_URL=issuer, SVC_IDLE_CONNECTION_TIMEOUT="1",
                       SVC_HTTP_CONNECTION=connection)
    proc = start_process(["serve", "--port", str(port)], env, port, log_path=tmp_path / "serve.log")
    try:
        silent = socket.create_connection(("127.0.0.1", port))
        started = time.monotonic()
        assert 0.9 <= _closed_after(silent, started) < 3.0

        dribbling = socket.create_connection(("127.0.0.1", port))
        started = time.monotonic()
        dribbling.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        for number in range(12):  # a header line every 0.25 s, never the blank line that ends them
            time.sleep(0.25)
            try:
                dribbling.sendall(b"X-Slow-%d: 1\r\n" % number)
            except OSError:
                break  # closed by the server
        assert 0.9 <= _closed_after(dribbling, started) < 3.0

        kept_alive = socket.create_connection(("127.0.0.1", port))
        kept_alive.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        kept_alive.settimeout(5)
        answer = kept_alive.recv(65536)
        started = time.monotonic()
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b'{"status":"ok"}')
        assert 0.9 <= _closed_after(kept_alive, started) < 3.0

        slow_body = socket.create_connection(("127.0.0.1", port))
        slow_body.sendall(b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 2\r\n\r\n")
        time.sleep(2.5)  # more than the limit and two sweeps, with the headers in
        slow_body.sendall(b"{}")
        slow_body.settimeout(5)
        assert slow_body.recv(65536).startswith(b"HTTP/1.1 405")
        for sock in (silent, dribbling, kept_alive, slow_body):
            sock.close()
    finally:
        stop_process(proc)


def test_the_access_line_written_directly_is_the_line_the_logger_writes():
    """`serve`'s JSON handler, alone on the way up from a logger, writes an access line straight
    to its stream: the bytes the record would have become (but for its own timestamp); with
    anyone else on the way (a filter, another handler), the record goes the general way."""
    stream = io.StringIO()
    handler = JsonLineHandler(stream)
    handler.setFormatter(JsonFormatter())
    parent, log = logging.getLogger("svc_auth.test_direct"), logging.getLogger("svc_auth.test_direct.access")
    parent.addHandler(handler)
    parent.propagate = False
    try:
        assert sole_json_handler(log, logging.INFO) is handler
        def general(level: int, fields: tuple) -> str:
            """The general path's line: a plain record with the access fields as `extra=` gives them."""
            record = logging.LogRecord(log.name, level, __file__, 0, "%s %s %d", (fields[1], fields[2], fields[4]), None)
            for key, value in zip(("request_id", "method", "route", "path", "status", "duration_ms", "client"), fields):
                setattr(record, key, value)
            return JsonFormatter().format(record)

        fields = ("r" * 32, "GET", "/healthz", "/healthz/\u00e9\\x?y", 200, 0.25, "10.0.0.1")
        for level, status in ((logging.INFO, 200), (logging.ERROR, 503)):
            fields = fields[:4] + (status,) + fields[5:]
            assert handler.emit_access(log.name, level, *fields)
            direct = stream.getvalue().splitlines()[-1]
            for other in (general(level, fields), JsonFormatter().format(AccessRecord(log.name, level, *fields))):
                assert direct.split(",", 1)[1] == other.split(",", 1)[1] and direct.startswith('{"ts":"')
            assert json.loads(direct)["status"] == status
        # a query (which may hold a secret): written here too, redacted as the general path redacts it
        asked = fields[:3] + ("/cb?code=abc&patient=pat-1", 200) + fields[5:]
        assert handler.emit_access(log.name, logging.INFO, *asked)
        direct = stream.getvalue().splitlines()[-1]
        assert direct.split(",", 1)[1] == general(logging.INFO, asked).split(",", 1)[1]
        assert json.loads(direct)["path"] == "/cb?code=[REDACTED]&patient=pat-1"
        quiet = logging.StreamHandler(io.StringIO())
        quiet.setLevel(logging.ERROR)
        parent.addHandler(quiet)
        assert sole_json_handler(log, logging.INFO) is handler  # a handler above the level gets nothing
        assert sole_json_handler(log, logging.ERROR) is None
        parent.removeHandler(quiet)
        log.addFilter(lambda record: True)
        assert sole_json_handler(log, logging.INFO) is None
        log.filters.clear()
        handler.addFilter(lambda record: True)
        assert sole_json_handler(log, logging.INFO) is None
        handler.filters.clear()
        parent.propagate = True  # the root's handlers (pytest's) would get it too
        assert sole_json_handler(log, logging.INFO) is None or not logging.getLogger().handlers
    finally:
        parent.removeHandler(handler)
        parent.propagate = True


@pytest.mark.gen_test
async def test_a_request_is_in_flight_until_answered_or_dropped_before_its_body(app, http_client, http_port):
    """The drain (`serve` on SIGTERM) waits while `in_flight` > 0: a request counts from its headers
    to its answer, and one whose connection drops before its body is complete stops counting."""
    import asyncio
    response = await http_client.fetch(f"http://127.0.0.1:{http_port}/healthz")
    assert response.code == 200 and app.in_flight == 0
    reader, writer = await asyncio.open_connection("127.0.0.1", http_port)
    writer.write(b"POST /v1/oauth/token HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n"
                 b"Content-Type: application/x-www-form-urlencoded\r\n\r\ngrant_type")
    await writer.drain()
    for _ in range(200):
        if app.in_flight == 1:
            break
        await asyncio.sleep(0.01)
    assert app.in_flight == 1
    writer.close()
    for _ in range(200):
        if app.in_flight == 0:
            break
        await asyncio.sleep(0.01)
    assert app.in_flight == 0
