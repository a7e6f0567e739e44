"""svc-auth HTTP server: the Tornado application and `svc-auth serve`.

`python server.py [--port N]` is the same as `svc-auth serve`.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
from pathlib import Path

import uvloop
import tornado.netutil
import tornado.web

from conf import Settings
from runtime import Runtime
from handlers import bulk, console, fhir, oauth, objects, ops, sandbox_api, sandbox_hub, wellknown
from handlers.base import NotFoundHandler
from handlers.static import STATIC_DIR, StaticAssets
from handlers.rest import appointments as rest_appointments, billing as rest_billing, directory as rest_directory, \
    charts as rest_charts, invitations as rest_invitations, openapi as rest_openapi
from ops import metrics
from ops.observability import ObservedApplication
from ops.balance import BalancedAcceptor, ConnectionCounts, CountingHTTPServer, Slot
from ops.httpconn import HttptoolsServer
from ops.logwrites import batch_log_writes
from ops.processes import Pulse, Supervisor, SupervisorPolicy

log = logging.getLogger("svc_auth")


ROUTE_MODULES = (wellknown, oauth, bulk, fhir, sandbox_api, sandbox_hub, objects, ops,
                 rest_invitations, rest_directory, rest_billing, rest_appointments, rest_charts, rest_openapi,
                 console)
"""Every handler module contributes `routes(runtime)`; add a module here to mount it."""

BODY_FLOOR = 1024 * 1024


def connection_body_limit(settings) -> int:
    """The body the connection refuses outright (413 before reading it, or 400 under Tornado's own
    connection): SVC_MAX_BODY_BYTES, at least 1 MiB, so a body a little over the setting still gets
    BaseHandler's JSON 413 and none is buffered far past it (8 MiB a connection let 40 connections
    hold 330 MB of bodies every route refuses)."""
    return max(BODY_FLOOR, settings.max_body_bytes)

# Bytes read from a socket at once (HTTPServer's chunk_size: also its IOStreams' read_chunk_size).
# Tornado allocates a zeroed buffer of this size for every read; a request's headers and a token
# request's body fit in 16 KB, where the default 64 KB cost a 64 KB memset per read.
READ_CHUNK_SIZE = 16 * 1024


def make_app(runtime: Runtime, **tornado_settings) -> tornado.web.Application:
    routes = []
    for module in ROUTE_MODULES:
        routes += module.routes(runtime)
    # xsrf_cookies stays off: only the developer console's forms check the token (ConsoleHandler);
    # the _xsrf cookie serves its pages without a session, signed-in pages use the session's token.
    xsrf_cookie_kwargs = {"httponly": True, "samesite": "Lax", "path": "/console",
                          "secure": runtime.settings.issuer.startswith("https:")}
    return ObservedApplication(routes, runtime=runtime, default_handler_class=NotFoundHandler,
                               xsrf_cookies=False, xsrf_cookie_kwargs=xsrf_cookie_kwargs, static_path=str(STATIC_DIR), static_handler_class=StaticAssets,
                               **tornado_settings)


def serve(settings: Settings, port: int, processes: int = 1, address: str = "127.0.0.1",
          on_start=None, policy: SupervisorPolicy | None = None) -> None:
    """Listen on `port` with `processes` processes and run until SIGTERM/SIGINT.

    Under `--processes N` the forked processes share one listening socket and take new connections
    by least connections (`ops.balance`): a burst of keep-alive connections is split evenly; the
    parent supervises them under `policy` (`ops.processes`). After SIGTERM, requests in flight get
    `policy.drain_timeout` seconds to finish (systemd's TimeoutStopSec is longer)."""
    from runtime.startup import open_runtime
    from ops.startup import bind_error
    # A port in use, or a dependency that is down, stops here with one line (StartupError),
    # before any fork and before anything else is logged. The port is probed first (bound, not
    # listened on: nobody may connect before the signal handlers are in place).
    import socket
    try:
        with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((address, port))
    except OSError as exc:
        raise bind_error(exc, port, address) from None
    # Once, before forking: also creates the keys every process shares.
    first = open_runtime(settings, check_redis=True)
    try:
        first.keyring.load()  # the first key, once; a wrong SVC_HMAC_KEY stops here with one line
        first.ehr_keys.require_open()  # and so does an EHR client key it cannot open
        from keys.inventory import require_every_key
        require_every_key(first)  # a dropped SVC_HMAC_KEY_PREVIOUS that live secrets still need: one line
        from keys.holders import require_open_key
        require_open_key(first)  # a host at step 1 of a rotation after its rekey: one line
    finally:
        first.close()
    processes = processes or os.cpu_count() or 1
    try:
        sockets = tornado.netutil.bind_sockets(port, address=address)
    except OSError as exc:
        raise bind_error(exc, port, address) from None
    if processes > 1:
        # Every forked process counts into files in one directory; /metrics sums them.
        metrics.use_multiprocess_dir(os.environ.get(metrics.MULTIPROC_ENV)
                                     or Path(settings.var_dir) / "metrics" / f"serve-{port}")
        worker = Supervisor(processes, sockets, policy).run()
        slot, pulse = worker.slot, worker.pulse
    else:
        slot, pulse = Slot(ConnectionCounts(1), 0), None
    # uvloop: the event loop in C (libuv). Tornado runs on asyncio's loop interface, so only the
    # loop changes; it is created after the fork, as each process needs its own.
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_run(settings, sockets, slot, on_start, (policy or SupervisorPolicy()).drain_timeout, pulse))


async def _run(settings: Settings, sockets, slot: Slot, on_start, drain_seconds: float,
               pulse: Pulse | None) -> None:
    restore_log_writes = batch_log_writes(asyncio.get_running_loop())  # one write per loop turn, not per line
    try:
        await _serve_until_stopped(settings, sockets, slot, on_start, drain_seconds, pulse)
    finally:
        if restore_log_writes is not None:
            restore_log_writes()


async def _serve_until_stopped(settings: Settings, sockets, slot: Slot, on_start, drain_seconds: float,
                               pulse: Pulse | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # Before serving: a SIGTERM at start-up still drains. SIGHUP (the terminal or session went
    # away; the whole process group gets it) drains too, as under the supervisor (ops/processes.py).
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    runtime = Runtime(settings)
    runtime.metrics.count_per_loop_turn(loop)  # every request's counts added once per loop turn
    # Signing keys in memory before the first request (JWKS and signing never wait on the
    # database), then kept current, with the cached applications, as changes are announced.
    await runtime.run(runtime.keyring.load)
    # This process's SVC_HMAC_KEY noted in key_holder before it links a record (`keys rekey` waits for it).
    from keys.holders import KeyHeartbeat
    from workers.loops import run_every
    heartbeat = await runtime.run(KeyHeartbeat(runtime, "serve").start, run_every)
    runtime.changes.start()
    app = make_app(runtime)
    if settings.http_connection == "httptools":
        # llhttp parsing under the same Application (ops/httpconn.py): less CPU per request.
        server = HttptoolsServer(app, slot, idle_connection_timeout=settings.idle_connection_timeout,
                                 max_body_size=connection_body_limit(settings))
    else:
        server = CountingHTTPServer(app, xheaders=False, max_body_size=connection_body_limit(settings), chunk_size=READ_CHUNK_SIZE,
                                    idle_connection_timeout=settings.idle_connection_timeout, slot=slot)
    stop_scheduler = None
    if not settings.redis_url:
        # Embedded default: tasks run in a worker thread of this process, and this process also
        # schedules the nightly sync (a unique row per night keeps several processes to one run).
        from workers.scheduler import start_scheduler_thread
        runtime.task_queue  # noqa: B018  (starts the in-process worker)
        stop_scheduler = start_scheduler_thread(runtime)
    # What start-up made (modules, routes, caches: several hundred thousand objects) lives as long as
    # the process: out of the collector's way, a full collection scans only what came after. Left
    # in, each full collection held the IOLoop 40-60 ms, past the acceptor's STALL_SECONDS, so the
    # other process took the connections of a burst (tests/test_serve_process.py).
    gc.collect()
    gc.freeze()
    acceptor = BalancedAcceptor(server, sockets)
    acceptor.start()
    if on_start and slot.index == 0:  # the first process only (under --processes N, one seeds the demo)
        on_start(runtime)
    log.info("svc-auth listening on %s", ", ".join(str(s.getsockname()) for s in sockets))
    if pulse is not None:
        pulse.start()  # the supervisor's sign that this worker serves, then that its loop runs
    await stop.wait()
    runtime.draining = True  # /readyz says 503 from now on
    acceptor.stop()  # stop accepting at once, close this process's listening socket; let in-flight requests finish
    server.start_draining()  # every response from now on says Connection: close; idle connections close now
    deadline = loop.time() + drain_seconds
    while (app.in_flight > 0 or server.busy()) and loop.time() < deadline:
        await asyncio.sleep(0.02)
    if app.in_flight:
        log.warning("shutting down with %d requests still in flight", app.in_flight)
    await server.close_all_connections()
    if stop_scheduler is not None:
        stop_scheduler.set()
    await runtime.run(heartbeat.stop)
    runtime.close()
    log.info("svc-auth stopped")


if __name__ == "__main__":
    from cli import main
    sys.exit(main(["serve", *sys.argv[1:]]))
