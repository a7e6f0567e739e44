"""Readiness: can this process serve traffic? Named dependency checks, owned by the runtime.

A check is `fn(runtime) -> None` that raises when its dependency is unreachable, or returns
`SKIPPED` when the dependency is not configured. Each runtime has a `Readiness`
(`runtime.readiness`) with the default checks; other parts add theirs with
`runtime.readiness.add("name", fn)` (the same name replaces a check).
Checks run inline with short timeouts: readiness probes are rare and must stay cheap.
"""
from __future__ import annotations

import time

SKIPPED = "skipped"
TIMEOUT_SECONDS = 1.0

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
    import redis
    client = redis.Redis.from_url(url, socket_timeout=TIMEOUT_SECONDS, socket_connect_timeout=TIMEOUT_SECONDS)
    try:
        client.ping()
    finally:
        client.close()


def check_object_store(runtime):
    settings = runtime.settings
    if not settings.s3_bucket:
        return SKIPPED
    store = getattr(runtime, "object_store", None)
    if store is not None and hasattr(store, "ping"):
        return store.ping()
    import boto3
    from botocore.config import Config
    client = boto3.client("s3", endpoint_url=settings.s3_endpoint_url or None,
                          config=Config(connect_timeout=TIMEOUT_SECONDS, read_timeout=TIMEOUT_SECONDS,
                                        retries={"max_attempts": 1}))
    client.head_bucket(Bucket=settings.s3_bucket)


DEFAULT_CHECKS = (("database", check_database), ("redis", check_redis), ("object_store", check_object_store))


class Readiness:
    """The checks one runtime runs for `/readyz`."""

    def __init__(self, checks=DEFAULT_CHECKS):
        self.checks = dict(checks)

    def add(self, name: str, check) -> None:
        self.checks[name] = check

    def report(self, runtime) -> tuple[bool, dict]:
        """(ready, {check name: {"status": "ok"|"skipped"|"failed", "ms", "error"?}})."""
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
        if getattr(runtime, "draining", False):
            ready = False
            results["shutdown"] = {"status": "failed", "error": "the process is shutting down"}
        return ready, results
