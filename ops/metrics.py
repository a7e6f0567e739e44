"""Prometheus metrics of svc-auth, and the hooks other parts call to count what they do.

Metric objects are created on first use, so that `serve --processes N` can switch
prometheus_client to multiprocess mode (`use_multiprocess_dir`) before it is imported. In that
mode every forked process writes its samples to files in one directory and `/metrics` answered by
any of them reports the sum over all of them. Separate `serve` processes (one systemd unit per
port) each report their own figures: scrape every port.

Hooks for other parts (cheap, safe to call from any thread):
  count_token_issued(grant), count_rate_limit_rejection(operation),
  count_job(actor, outcome), register_queue_depth(fn) (fn() -> {queue: depth}, called per scrape).
"""
from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

_lock = threading.Lock()
_metrics = None
_queue_depth_sources: list = []


def use_multiprocess_dir(directory: str | Path) -> Path:
    """Switch to multiprocess mode with a fresh `directory`; call before any metric is used."""
    if _metrics is not None:
        raise RuntimeError("metrics were already created in single-process mode")
    path = Path(directory)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, exist_ok=True)
    os.environ[MULTIPROC_ENV] = str(path)
    return path


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or None


class _Metrics:
    def __init__(self):
        from prometheus_client import Counter, Histogram
        self.requests = Counter("svc_http_requests_total", "HTTP requests by route pattern, method and status",
                                ["route", "method", "status"])
        self.latency = Histogram("svc_http_request_duration_seconds", "HTTP request latency by route pattern",
                                 ["route", "method"], buckets=LATENCY_BUCKETS)
        self.tokens = Counter("svc_tokens_issued_total", "Tokens issued by the token endpoint, by grant type",
                              ["grant"])
        self.rate_limited = Counter("svc_rate_limit_rejections_total", "Requests refused with 429, by operation",
                                    ["operation"])
        self.jobs = Counter("svc_jobs_total", "Background jobs finished, by actor and outcome",
                            ["actor", "outcome"])


def metrics() -> _Metrics:
    global _metrics
    if _metrics is None:
        with _lock:
            if _metrics is None:
                _metrics = _Metrics()
    return _metrics


_children: dict = {}


def _child(metric, *labels):
    """`metric.labels(*labels)`, remembered: the lookup costs more than the increment. Routes,
    methods, statuses and grants are few, so this stays small."""
    key = (metric, labels)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*labels)
    return child


def observe_request(route: str, method: str, status: int, seconds: float) -> None:
    m = metrics()
    _child(m.requests, route, method, str(status)).inc()
    _child(m.latency, route, method).observe(seconds)


def count_token_issued(grant: str) -> None:
    _child(metrics().tokens, grant).inc()


def count_rate_limit_rejection(operation: str) -> None:
    metrics().rate_limited.labels(operation).inc()


def count_job(actor: str, outcome: str) -> None:
    """`outcome`: e.g. "succeeded", "failed", "retried"."""
    metrics().jobs.labels(actor, outcome).inc()


def register_queue_depth(source) -> None:
    """Report `source()` -> {queue name: messages waiting} as `svc_queue_depth` on every scrape."""
    _queue_depth_sources.append(source)


class _QueueDepthCollector:
    def collect(self):
        from prometheus_client.core import GaugeMetricFamily
        family = GaugeMetricFamily("svc_queue_depth", "Messages waiting, per queue", labels=["queue"])
        for source in list(_queue_depth_sources):
            try:
                depths = source() or {}
            except Exception:  # a broker that is down must not break the scrape
                continue
            for queue, depth in depths.items():
                family.add_metric([str(queue)], float(depth))
        yield family


def exposition() -> tuple[bytes, str]:
    """The text exposition of every metric (summed over processes in multiprocess mode)."""
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
    metrics()
    if multiprocess_dir():
        return _multiprocess_exposition(), CONTENT_TYPE_LATEST
    else:
        registry = CollectorRegistry()
        registry.register(_RegistryView(REGISTRY))
    registry.register(_QueueDepthCollector())
    return generate_latest(registry), CONTENT_TYPE_LATEST


def _multiprocess_exposition(attempts: int = 5) -> bytes:
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess
    for attempt in range(attempts):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        registry.register(_QueueDepthCollector())
        try:
            return generate_latest(registry)
        except Exception:
            # Another process may be creating its sample file right now (size 0 for a moment):
            # read again rather than fail the scrape.
            if attempt == attempts - 1:
                raise
            time.sleep(0.01)


class _RegistryView:
    """The default registry's collectors, inside a per-scrape registry that adds queue depths."""

    def __init__(self, registry):
        self.registry = registry

    def collect(self):
        return self.registry.collect()


def mark_process_dead(pid: int) -> None:
    """Drop a dead forked process's live gauges (multiprocess mode)."""
    if multiprocess_dir():
        from prometheus_client import multiprocess
        multiprocess.mark_process_dead(pid)
