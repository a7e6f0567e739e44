"""`python -m bench.async_db [--seconds S]`: how to keep blocking database work off the IOLoop.

Compares, on PostgreSQL (a scratch database), one-row primary-key lookups driven from asyncio:
- `sync`: plain Peewee on psycopg2, sequential, on the loop (what the handlers did before);
- `thread pool`: the same function through `Runtime.run`'s bounded ThreadPoolExecutor (8 threads,
  one psycopg2 connection each), 32 concurrent callers;
- `pwasyncio`: Peewee 4's `AsyncPostgresqlDatabase` (asyncpg) with `await db.run(fn)`, 32 callers.
For each it also reports the event loop's lag (p99 of a 1 ms timer) while the lookups run: what a
`/healthz` beside them would wait. Prints one JSON object; BENCHMARKS.md quotes it.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import peewee

from bench.fleet import scratch_database

ROWS = 1000
CALLERS = 32
THREADS = 8


def probe_model(db):
    class Probe(peewee.Model):
        name = peewee.CharField()

        class Meta:
            database = db
    return Probe


async def loop_lag(stop: asyncio.Event) -> list[float]:
    lags = []
    while not stop.is_set():
        started = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append((time.perf_counter() - started - 0.001) * 1000)
    return lags


def p99(values):
    return round(statistics.quantiles(values, n=100)[98], 2) if len(values) > 2 else None


async def measure(lookup_async, seconds: float) -> dict:
    stop = asyncio.Event()
    lag_task = asyncio.create_task(loop_lag(stop))
    count = 0
    deadline = time.perf_counter() + seconds

    async def caller(i):
        nonlocal count
        n = i
        while time.perf_counter() < deadline:
            await lookup_async(n % ROWS + 1)
            count += 1
            n += CALLERS
    started = time.perf_counter()
    await asyncio.gather(*(caller(i) for i in range(CALLERS)))
    elapsed = time.perf_counter() - started
    stop.set()
    lags = await lag_task
    return {"lookups_per_s": round(count / elapsed), "loop_lag_p99_ms": p99(lags),
            "loop_lag_max_ms": round(max(lags), 1) if lags else None, "lag_samples": len(lags)}


def run(url: str, seconds: float) -> dict:
    results = {}
    sync_db = peewee.PostgresqlDatabase(url.rsplit("/", 1)[1], **_dsn(url))
    Probe = probe_model(sync_db)
    sync_db.create_tables([Probe])
    Probe.insert_many([{"name": f"row {i}"} for i in range(ROWS)]).execute()
    local = {}

    def lookup(pk):
        return Probe.get_by_id(pk)

    async def on_loop(pk):  # the old shape: the loop itself blocks on the socket
        return lookup(pk)
    results["sync_on_loop"] = asyncio.run(measure(on_loop, seconds))

    executor = ThreadPoolExecutor(THREADS)

    async def pooled(pk):
        return await asyncio.get_running_loop().run_in_executor(executor, lookup, pk)
    results["thread_pool"] = asyncio.run(measure(pooled, seconds))
    executor.shutdown()
    sync_db.close()
    local.clear()

    try:
        from playhouse.pwasyncio import AsyncPostgresqlDatabase
        import asyncpg  # noqa: F401
    except ImportError as exc:
        results["pwasyncio"] = {"skipped": str(exc)}
        return results
    async_db = AsyncPostgresqlDatabase(url.rsplit("/", 1)[1], pool_size=THREADS, **_dsn(url))
    Probe.bind(async_db)

    async def with_pwasyncio(pk):
        return await async_db.run(lookup, pk)

    async def main():
        try:
            return await measure(with_pwasyncio, seconds)
        finally:
            await async_db.close_pool()
    results["pwasyncio"] = asyncio.run(main())
    return results


def _dsn(url: str) -> dict:
    from urllib.parse import urlsplit
    parts = urlsplit(url)
    return {"host": parts.hostname, "port": parts.port or 5432, "user": parts.username or "postgres",
            **({"password": parts.password} if parts.password else {})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--postgres-url", default=os.environ.get("BENCH_POSTGRES_URL",
                                                                 "postgresql://postgres@127.0.0.1:5432/postgres"))
    args = parser.parse_args()
    with scratch_database(args.postgres_url) as url:
        print(json.dumps({"callers": CALLERS, "threads": THREADS, "rows": ROWS, **run(url, args.seconds)}))


if __name__ == "__main__":
    main()
