"""Readiness: can this process serve traffic? Named dependency checks, owned by the runtime.

A check is `fn(runtime) -> None` that raises when its dependency is unreachable, or returns
`SKIPPED` when the dependency is not configured. Each runtime has a `Readiness`
(`runtime.readiness`) with the default checks; other parts add theirs with
`runtime.readiness.add("name", fn)` (the same name replaces a check).

`/readyz` is unauthenticated and its checks run on the shared pool, so what a probe costs is
bounded: the clients the checks use (Redis, S3) are made once per runtime and reused
(`Readiness.client`; a new boto3 client costs ~10 ms of CPU), the probes that arrive while one
report is being computed all get that report, and a report is reused for CACHE_SECONDS
(`Readiness.answer`). A dependency that is down fails its check within its 1 s timeout, one attempt.
Whether the process drains is read at every answer, never cached.
"""
from __future__ import annotations

import asyncio
import threading
import time

SKIPPED = "skipped"
TIMEOUT_SECONDS = 1.0
CACHE_SECONDS = 1.0
"""A report answers the probes of this long after it was computed."""

def check_database(runtime):
    from models.db import DATABASE_ERRORS, discard
    try:
        runtime.db.execute_sql("SELECT 1").fetchone()
    except DATABASE_ERRORS:
        # This thread's held connection may predate an outage that is already over: what the
        # database says now is what a fresh connection gets, so ask once more on one.
        discard(runtime.db)
        try:
            runtime.db.execute_sql("SELECT 1").fetchone()
        except DATABASE_ERRORS:
            discard(runtime.db)
            raise


def check_redis(runtime):
    url = runtime.settings.redis_url
    if not url:
        return SKIPPED
    def connect():
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
        return redis.Redis.from_url(url, socket_timeout=TIMEOUT_SECONDS, socket_connect_timeout=TIMEOUT_SECONDS,
                                    retry=Retry(NoBackoff(), 0))
    runtime.readiness.client(("redis", url), connect).ping()  # a broken connection is replaced at the next ping


def check_object_store(runtime):
    settings = runtime.settings
    if not settings.s3_bucket:
        return SKIPPED
    store = getattr(runtime, "object_store", None)
    if store is not None and hasattr(store, "ping"):
        return store.ping()
    def connect():
        import boto3
        from botocore.config import Config
        return boto3.session.Session().client(
            "s3", endpoint_url=settings.s3_endpoint_url or None,
            config=Config(connect_timeout=TIMEOUT_SECONDS, read_timeout=TIMEOUT_SECONDS, retries={"max_attempts": 1}))
    client = runtime.readiness.client(("s3", settings.s3_endpoint_url), connect)
    client.head_bucket(Bucket=settings.s3_bucket)


DEFAULT_CHECKS = (("database", check_database), ("redis", check_redis), ("object_store", check_object_store))


class Readiness:
    """The checks one runtime runs for `/readyz`, the clients they keep, and the last report."""

    def __init__(self, checks=DEFAULT_CHECKS):
        self.checks = dict(checks)
        self._clients: dict = {}
        self._clients_lock = threading.Lock()
        self._cached = None  # (computed at, the settings it was computed with, (ready, results))
        self._pending = None  # (loop, future of the report being computed)

    def add(self, name: str, check) -> None:
        self.checks[name] = check
        self._cached = None

    def client(self, key, factory):
        """The client a check keeps under `key` (e.g. ("redis", url)), made by `factory()` once."""
        with self._clients_lock:
            client = self._clients.get(key)
            if client is None:
                client = self._clients[key] = factory()
            return client

    def close(self) -> None:
        with self._clients_lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            try:
                client.close()
            except Exception:  # closing is best effort: the process is ending
                pass

    async def answer(self, runtime) -> tuple[bool, dict]:
        """`report` for `/readyz`, on the runtime's pool: the report computed less than
        CACHE_SECONDS ago, or the one being computed, else a new one."""
        loop = asyncio.get_running_loop()
        cached = self._cached
        if cached is not None and cached[1] is runtime.settings and time.monotonic() - cached[0] < CACHE_SECONDS:
            return self._with_draining(runtime, *cached[2])
        pending = self._pending
        if pending is None or pending[0] is not loop or pending[1].done():
            future = asyncio.ensure_future(runtime.run(self._checked, runtime))
            pending = self._pending = (loop, future)

            def done(future, settings=runtime.settings) -> None:
                if self._pending is not None and self._pending[1] is future:
                    self._pending = None
                if not future.cancelled() and future.exception() is None:
                    self._cached = (time.monotonic(), settings, future.result())
            future.add_done_callback(done)
        ready, results = await asyncio.shield(pending[1])
        return self._with_draining(runtime, ready, results)

    def report(self, runtime) -> tuple[bool, dict]:
        """(ready, {check name: {"status": "ok"|"skipped"|"failed", "ms", "error"?}}), computed now."""
        return self._with_draining(runtime, *self._checked(runtime))

    @staticmethod
    def _with_draining(runtime, ready: bool, results: dict) -> tuple[bool, dict]:
        if getattr(runtime, "draining", False):
            results = {**results, "shutdown": {"status": "failed", "error": "the process is shutting down"}}
            ready = False
        return ready, results

    def _checked(self, runtime) -> tuple[bool, dict]:
        results, ready = {}, True
        for name, check in list(self.checks.items()):
            started = time.perf_counter()
            try:
                outcome = check(runtime)
                entry = {"status": SKIPPED if outcome == SKIPPED else "ok"}
            except Exception as exc:  # any failure means "not ready"; the reason is for the operator
                ready = False
                entry = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"[:300]}
            entry["ms"] = round((time.perf_counter() - started) * 1000, 1)
            results[name] = entry
        return ready, results
