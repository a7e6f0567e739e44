"""A measurement, not a server: what Tornado's HTTP/1.1 connection layer costs per request (issue 49).

`python -m bench.lean_connection [--rounds N] [--seconds S]` seeds one embedded database, starts
`svc-auth serve --processes 1` on it and, beside it, the same `Application` (`server.make_app`, every
handler, the access log, the metrics) behind `LeanConnection`: an asyncio `Protocol` on uvloop's
transport that implements Tornado's public `httputil.HTTPConnection` and hands each request to
`Application.start_request`, instead of `HTTP1ServerConnection` over an `IOStream`. It then drives
both with wrk (16 connections), `client_credentials` tokens and `/healthz`, alternating, and prints
the CPU of each process per request.

`python -m bench.lean_connection --settings` measures the real thing instead: `serve` with
`SVC_HTTP_CONNECTION=httptools` (ops/httpconn.py, the connection this prototype became) against
`SVC_HTTP_CONNECTION=tornado`, each on its own seeded database, alternating.

`LeanConnection` knows only what wrk sends: Content-Length bodies and keep-alive. No chunked bodies,
no `Expect: 100-continue`, no HTTP/1.0, no limits, no back-pressure, no idle timeout, no connection
count for the balancer: it is the lower bound of a connection layer, kept here so the figure in
BENCHMARKS.md ("Issue 49: where a token's CPU goes") can be measured again. It is not mounted by
`serve` and must not be.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from pathlib import Path

from tornado import httputil
from tornado.concurrent import Future

ROOT = Path(__file__).resolve().parent.parent


class _Context:
    """What `HTTPServerRequest` reads from its connection's `context`."""

    def __init__(self, remote_ip: str):
        self.remote_ip, self.protocol, self.trusted_downstream = remote_ip, "http", None


def _done() -> Future:
    future = Future()
    future.set_result(None)
    return future


class LeanConnection(asyncio.Protocol, httputil.HTTPConnection):
    """One keep-alive connection: parse a request (start line, headers, Content-Length body) from
    the bytes received, run it through the application, write the response to the transport."""

    def __init__(self, app):
        self.app, self.buffer, self.busy = app, b"", False
        self.transport = self.context = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.context = _Context(transport.get_extra_info("peername")[0])

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self._next_request()

    def _next_request(self) -> None:
        buffer = self.buffer
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = buffer[:end].decode("latin1")
        eol = head.find("\r\n")
        start_line = httputil.parse_request_start_line(head[:eol] if eol >= 0 else head)
        headers = httputil.HTTPHeaders.parse(head[eol:]) if eol >= 0 else httputil.HTTPHeaders()
        length = int(headers.get("Content-Length", "0"))
        if len(buffer) < end + 4 + length:
            return
        body, self.buffer = buffer[end + 4:end + 4 + length], buffer[end + 4 + length:]
        self.busy = True
        delegate = self.app.start_request(None, self)
        delegate.headers_received(start_line, headers)
        if body:
            delegate.data_received(body)
        delegate.finish()

    # -- httputil.HTTPConnection --------------------------------------------------------------
    def set_close_callback(self, callback) -> None:
        """RequestHandler registers its on_connection_close here; this measurement never calls it."""

    def write_headers(self, start_line, headers, chunk=None) -> Future:
        lines = [f"HTTP/1.1 {start_line.code} {start_line.reason}"] + [f"{k}: {v}" for k, v in headers.get_all()]
        self.transport.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin1") + (chunk or b""))
        return _done()

    def write(self, chunk: bytes) -> Future:
        self.transport.write(chunk)
        return _done()

    def finish(self) -> None:
        self.busy = False
        if self.buffer:
            asyncio.get_running_loop().call_soon(self._next_request)


async def _serve_lean(port: int) -> None:
    """The application `serve` builds (settings from the environment), behind LeanConnection."""
    sys.path.insert(0, str(ROOT))
    from conf import Settings
    from conf.logging import configure_logging
    from ops.logwrites import batch_log_writes
    from runtime import Runtime
    from server import make_app
    settings = Settings.from_env(dotenv=None)
    configure_logging(settings.log_level)
    loop = asyncio.get_running_loop()
    batch_log_writes(loop)
    runtime = Runtime(settings)
    await runtime.run(runtime.keyring.load)
    runtime.changes.start()
    app = make_app(runtime)
    await loop.create_server(lambda: LeanConnection(app), "127.0.0.1", port)
    print("ready", flush=True)
    await asyncio.Event().wait()


def _measure(targets: dict, env: dict, rounds: int, seconds: float) -> dict:
    """CPU per request of each target {name: (url, pid)}, alternating rounds (the first unmeasured)."""
    from bench import loadgen
    from bench.remote_db import _proc_cpu
    totals: dict = {}
    for number in range(rounds + 1):
        for kind, path, lua in (("token", "/v1/oauth/token", "post"), ("healthz", "/healthz", "get")):
            for name in (list(targets) if number % 2 else list(targets)[::-1]):
                url, pid = targets[name]
                before = _proc_cpu(pid)
                run = loadgen.run(url + path, lua, 16, seconds, env=env)
                cpu, answered = _proc_cpu(pid) - before, run["rps"] * run["seconds"]
                if run["errors"]:
                    raise RuntimeError(f"{name} {kind}: {run['errors']}")
                if number:
                    total = totals.setdefault(f"{name} {kind}", [0.0, 0.0])
                    total[0] += cpu
                    total[1] += answered
                print(f"round {number}{' (warm-up)' if not number else ''}, {name} {kind}: "
                      f"{cpu / answered * 1e6:.1f} CPU us per request", flush=True)
    return {key: round(cpu / answered * 1e6, 1) for key, (cpu, answered) in totals.items()}


def compare(rounds: int, seconds: float) -> dict:
    """CPU per request of `serve` and of the lean connection, alternating rounds (the first unmeasured)."""
    from bench.service import BenchService, free_port
    service = BenchService(None, processes=1)
    service.seed()
    service.start_seeded()
    port = free_port()
    lean = subprocess.Popen([sys.executable, "-m", "bench.lean_connection", "--serve", str(port)], env=service.env,
                            cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        if not lean.stdout.readline().startswith("ready"):
            raise RuntimeError("the lean connection did not start")
        targets = {"serve": (service.url, service.proc.pid), "lean": (f"http://127.0.0.1:{port}", lean.pid)}
        env = {"BENCH_BODY": "grant_type=client_credentials", "BENCH_AUTHORIZATION": service.client_auth}
        return _measure(targets, env, rounds, seconds)
    finally:
        lean.terminate()
        lean.wait()
        service.stop()


def compare_settings(rounds: int, seconds: float) -> dict:
    """CPU per request of `serve` with SVC_HTTP_CONNECTION=httptools and =tornado (ops/httpconn.py),
    each on its own seeded embedded database, alternating rounds."""
    from bench.service import BenchService
    services = {kind: BenchService(None, processes=1, extra_env={"SVC_HTTP_CONNECTION": kind})
                for kind in ("httptools", "tornado")}
    try:
        for service in services.values():
            service.seed()
            service.start_seeded()
        targets = {kind: (service.url, service.proc.pid) for kind, service in services.items()}
        auth = {kind: service.client_auth for kind, service in services.items()}
        # wrk sends one Authorization header: each service gets its own client, so measure each
        # with its own credentials (the loop alternates the order).
        totals: dict = {}
        results = {}
        for number in range(rounds):
            for kind in (list(targets) if number % 2 else list(targets)[::-1]):
                env = {"BENCH_BODY": "grant_type=client_credentials", "BENCH_AUTHORIZATION": auth[kind]}
                part = _measure({kind: targets[kind]}, env, 1, seconds)
                for key, value in part.items():
                    totals.setdefault(key, []).append(value)
        for key, values in totals.items():
            results[key] = round(sum(values) / len(values), 1)
        return results
    finally:
        for service in services.values():
            service.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--settings", action="store_true",
                        help="compare serve with SVC_HTTP_CONNECTION=httptools and =tornado instead")
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        import uvloop
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_serve_lean(args.serve))
        return
    result = (compare_settings if args.settings else compare)(args.rounds, args.seconds)
    for key, value in sorted(result.items()):
        print(f"{key}: {value} CPU us per request")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    main()
