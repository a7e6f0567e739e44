"""Prometheus metrics of svc-auth, and the hooks other parts call to count what they do.

Each runtime owns one `Metrics` (`runtime.metrics`, built on first use) with its own collector
registry: there is no process-wide metric state. `serve --processes N` switches prometheus_client
to multiprocess mode (`use_multiprocess_dir`) before the fork and before prometheus_client is
imported; every forked process then writes its samples to files in one directory and `/metrics`
answered by any of them reports the sum over all of them. Separate `serve` processes (one
systemd unit per port) each report their own figures: scrape every port.

What other parts count (cheap, safe from any thread), all on `runtime.metrics`:
  observe_request(route, method, status, seconds), count_token_issued(grant),
  count_rate_limit_rejection(operation), count_job(actor, outcome),
  add_queue_depth(fn) (fn() -> {queue: depth}, called per scrape).
"""
from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"))
"""The methods a request's `method` label names (Tornado's RequestHandler.SUPPORTED_METHODS); any
other token a client sends is labelled OTHER: with SVC_HTTP_CONNECTION=tornado any token reaches
the application, and each new one would add a set of series to every scrape."""
OTHER_METHOD = "OTHER"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def use_multiprocess_dir(directory: str | Path) -> Path:
    """Switch to multiprocess mode with a fresh `directory`; call before any metric is created."""
    path = Path(directory)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, exist_ok=True)
    os.environ[MULTIPROC_ENV] = str(path)
    return path


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or None


class Metrics:
    """One runtime's metrics: request counts and latency, tokens, 429s, jobs, queue depths."""

    def __init__(self):
        from prometheus_client import (CollectorRegistry, Counter, GCCollector, Histogram, PlatformCollector,
                                       ProcessCollector)
        self.registry = CollectorRegistry()
        if not multiprocess_dir():  # one process: its own process_* and python_* figures too
            for collector in (ProcessCollector, PlatformCollector, GCCollector):
                collector(registry=self.registry)
        labelled = {"registry": self.registry}
        self.requests = Counter("svc_http_requests_total", "HTTP requests by route pattern, method and status",
                                ["route", "method", "status"], **labelled)
        self.latency = Histogram("svc_http_request_duration_seconds", "HTTP request latency by route pattern",
                                 ["route", "method"], buckets=LATENCY_BUCKETS, **labelled)
        self.tokens = Counter("svc_tokens_issued_total", "Tokens issued by the token endpoint, by grant type",
                              ["grant"], **labelled)
        self.rate_limited = Counter("svc_rate_limit_rejections_total", "Requests refused with 429, by operation",
                                    ["operation"], **labelled)
        self.jobs = Counter("svc_jobs_total", "Background jobs finished, by actor and outcome",
                            ["actor", "outcome"], **labelled)
        self.queue_depths = _QueueDepthCollector()
        self.registry.register(self.queue_depths)
        self._children: dict = {}
        self._request_children: dict = {}  # (route, method, status) -> (count child, latency child)
        self._loop = self._loop_thread = None  # see `count_per_loop_turn`
        self._pending: dict = {}  # counter child -> counts waiting for the end of the loop turn

    def _child(self, metric, *labels):
        """`metric.labels(*labels)`, remembered: the lookup costs more than the increment. Routes,
        methods, statuses and grants are few, so this stays small."""
        key = (metric, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        if method not in METHODS:
            method = OTHER_METHOD  # a client's made-up token is not a label value (nor a key below)
        key = (route, method, status)  # one lookup per request for both children
        children = self._request_children.get(key)
        if children is None:
            children = self._request_children[key] = (
                self.requests.labels(route, method, str(status)), self._child(self.latency, route, method))
        self._count(children[0])
        children[1].observe(seconds)

    def count_token_issued(self, grant: str) -> None:
        self._count(self._child(self.tokens, grant))

    def count_per_loop_turn(self, loop) -> None:
        """From now on, the request and token counts made on `loop`'s thread (called there) are
        summed and added to their counters once per loop turn, at its end: in multiprocess mode
        every increment takes a lock, a `getpid` and a write to the process's file (issue 49). A
        count waits at most one loop turn; counts from any other thread are added at once."""
        self._loop, self._loop_thread = loop, threading.get_ident()

    def _count(self, child) -> None:
        if self._loop_thread is not None and threading.get_ident() == self._loop_thread:
            pending = self._pending
            if not pending:
                self._loop.call_soon(self.flush)
            pending[child] = pending.get(child, 0) + 1
        else:
            child.inc()

    def flush(self) -> None:
        """Add the counts waiting for the end of the loop turn (on the loop's thread)."""
        pending, self._pending = self._pending, {}
        for child, count in pending.items():
            child.inc(count)

    def count_rate_limit_rejection(self, operation: str) -> None:
        self._child(self.rate_limited, operation).inc()

    def count_job(self, actor: str, outcome: str) -> None:
        """`outcome`: "succeeded" or "failed" (an attempt that raised; Dramatiq may retry it)."""
        self._child(self.jobs, actor, outcome).inc()

    def add_queue_depth(self, source) -> None:
        """Report `source()` -> {queue name: messages waiting} as `svc_queue_depth` on every scrape."""
        self.queue_depths.sources.append(source)

    def exposition(self) -> tuple[bytes, str]:
        """The text exposition of every metric (summed over processes in multiprocess mode)."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        if multiprocess_dir():
            return self._multiprocess_exposition(), CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def _multiprocess_exposition(self, attempts: int = 5) -> bytes:
        from prometheus_client import CollectorRegistry, generate_latest, multiprocess
        for attempt in range(attempts):
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            registry.register(self.queue_depths)
            try:
                return generate_latest(registry)
            except Exception:
                # Another process may be creating its sample file right now (size 0 for a moment):
                # read again rather than fail the scrape.
                if attempt == attempts - 1:
                    raise
                time.sleep(0.01)


class _QueueDepthCollector:
    def __init__(self):
        self.sources: list = []

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily
        family = GaugeMetricFamily("svc_queue_depth", "Messages waiting, per queue", labels=["queue"])
        for source in list(self.sources):
            try:
                depths = source() or {}
            except Exception:  # a broker that is down must not break the scrape
                continue
            for queue, depth in depths.items():
                family.add_metric([str(queue)], float(depth))
        yield family


def mark_process_dead(pid: int) -> None:
    """Drop a dead forked process's live gauges (multiprocess mode)."""
    if multiprocess_dir():
        from prometheus_client import multiprocess
        multiprocess.mark_process_dead(pid)
