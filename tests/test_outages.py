"""The database and Redis may go away: real servers of the test's own, stopped under load.

`svc-auth serve --processes 2` runs as a subprocess against a PostgreSQL (initdb + pg_ctl) or a
Redis (`redis-server --port N`) that only this test uses. While the dependency is down, requests
that need it answer 503 + Retry-After (never a 500); `/healthz` and the JWKS keep answering; once
it is back the service recovers by itself, with no restart, and `/readyz` says so.
"""
from __future__ import annotations

import json
import time

import pytest

from bench.instances import LocalPostgres, LocalRedis
from bench.outage import NO_LIMITS, client_token, load_for, run_outage, seed
from conf import Settings
from helpers.processes import free_port, settings_env, start_process, stop_process

RECOVERY_SECONDS = 5.0


def assert_survived(result: dict, needs_dependency: list[str]) -> None:
    kinds = result["kinds"]
    for kind, figures in kinds.items():
        assert figures["status_500"] == 0, (kind, figures)
        assert figures["no_answer"] == 0, (kind, figures)
        assert figures["503_without_retry_after"] == 0, (kind, figures)
    for kind in ("healthz", "jwks"):
        assert set(kinds[kind]["statuses"]) == {"200"}, kinds[kind]
    assert kinds["organizations"]["status_503"] > 0, kinds["organizations"]  # the outage was seen
    for kind in needs_dependency:
        assert kinds[kind]["first_success_after_s"] is not None, kinds[kind]
        assert kinds[kind]["first_success_after_s"] <= RECOVERY_SECONDS, kinds[kind]
        assert (kinds[kind]["last_failure_after_s"] or 0) <= RECOVERY_SECONDS, kinds[kind]


@pytest.mark.slow
def test_postgresql_stopped_under_load_gives_503s_then_recovers_by_itself(tmp_path):
    pg = LocalPostgres()
    proc = None
    try:
        pg.start()
        settings = Settings.build(issuer="http://127.0.0.1:8888", database_url=pg.url, var_dir=str(tmp_path / "var"),
                                  keys_dir=str(tmp_path / "keys"), hmac_key="o" * 32)
        seeded = seed(settings)
        port = free_port()
        proc = start_process(["serve", "--port", str(port), "--processes", "2"],
                             settings_env(settings, SVC_RATE_LIMITS=NO_LIMITS), port, log_path=tmp_path / "serve.log")
        token = client_token(port, seeded)
        result = run_outage(port, load_for(port, seeded, token), pg.stop, pg.start, outage_seconds=3.0, after=6.0)
        print(json.dumps(result))
        assert_survived(result, ["organizations", "token"])  # token: until the client cache (i11-keys) serves it
        assert result["readyz"]["during"]["status"] == 503
        assert result["readyz"]["during"]["checks"]["database"] == "failed"
        assert result["readyz"]["after"]["status"] == 200, result["readyz"]
        assert proc.poll() is None  # recovered without a restart
    finally:
        if proc is not None:
            stop_process(proc)
        pg.destroy()
    assert "Traceback" not in (tmp_path / "serve.log").read_text()


@pytest.mark.slow
def test_redis_stopped_under_load_gives_503s_then_recovers_by_itself(tmp_path):
    redis = LocalRedis()
    proc = None
    try:
        redis.start()
        settings = Settings.build(issuer="http://127.0.0.1:8888", database_url=f"sqlite:///{tmp_path / 'svc.db'}",
                                  redis_url=redis.url, var_dir=str(tmp_path / "var"), keys_dir=str(tmp_path / "keys"),
                                  hmac_key="r" * 32)
        seeded = seed(settings)
        port = free_port()
        proc = start_process(["serve", "--port", str(port), "--processes", "2"],
                             settings_env(settings, SVC_RATE_LIMITS=NO_LIMITS), port, log_path=tmp_path / "serve.log")
        token = client_token(port, seeded)
        result = run_outage(port, load_for(port, seeded, token), redis.stop, redis.start, outage_seconds=3.0,
                            after=6.0)
        print(json.dumps(result))
        assert_survived(result, ["organizations"])
        assert result["readyz"]["during"]["checks"]["redis"] == "failed"
        assert result["readyz"]["after"]["status"] == 200, result["readyz"]
    finally:
        if proc is not None:
            stop_process(proc)
        redis.destroy()
    assert "Traceback" not in (tmp_path / "serve.log").read_text()


class DatabaseLock:
    """Hold a write lock from another connection: SQLite's database write lock (BEGIN IMMEDIATE),
    or a PostgreSQL table lock (LOCK TABLE ... ACCESS EXCLUSIVE) on `table`."""

    def __init__(self, settings: Settings, table: str):
        url = settings.database_url
        if url.startswith("sqlite"):
            import sqlite3
            self.conn = sqlite3.connect(url[len("sqlite:///"):], isolation_level=None)
            self.conn.execute("BEGIN IMMEDIATE")
        else:
            import psycopg2
            self.conn = psycopg2.connect(url)
            self.conn.cursor().execute(f'LOCK TABLE "{table}" IN ACCESS EXCLUSIVE MODE')

    def release(self) -> None:
        self.conn.rollback() if hasattr(self.conn, "autocommit") else self.conn.execute("ROLLBACK")
        self.conn.close()


@pytest.mark.gen_test(timeout=60)
async def test_healthz_and_jwks_stay_fast_while_a_token_request_waits_on_a_locked_database(api, flow, settings):
    import asyncio
    code = await flow.code()
    lock = DatabaseLock(settings, "authorization_code")
    try:
        slow = asyncio.ensure_future(flow.exchange(code))  # consuming the code is a write: it waits
        await asyncio.sleep(0.5)
        assert not slow.done()
        latencies = []
        for i in range(80):
            started = time.perf_counter()
            status, _, _ = await api.call("GET", "/healthz" if i % 2 else "/.well-known/jwks.json")
            latencies.append(time.perf_counter() - started)
            assert status == 200
        assert not slow.done(), "the token request is still waiting on the lock"
        latencies.sort()
        p99 = latencies[int(len(latencies) * 0.99) - 1]
        assert p99 < 0.2, f"p99 {p99 * 1000:.1f} ms while a request waits on the database"  # loose: shared CPU
    finally:
        lock.release()
    status, _, body = await slow
    assert status == 200 and body["token_type"] == "Bearer", body


def test_unit_of_work_maps_dependency_failures_to_503(runtime):
    """The one mapping: a database error discards the connection and answers 503 + Retry-After; so
    does Redis unreachable from blocking work (e.g. the failed-authentication counts)."""
    import peewee
    from errors import ApiError
    from ratelimit import RateLimiterUnavailable

    def database_gone():
        runtime.db.execute_sql("SELECT 1")
        raise peewee.OperationalError("server closed the connection unexpectedly")

    def redis_gone():
        raise RateLimiterUnavailable("Connection refused")

    for fn in (database_gone, redis_gone):
        with pytest.raises(ApiError) as caught:
            runtime.unit_of_work(fn)
        assert caught.value.status == 503 and caught.value.headers["Retry-After"]
        assert caught.value.body()["error"] == "temporarily_unavailable"
    assert runtime.unit_of_work(lambda: runtime.db.execute_sql("SELECT 1").fetchone()) == (1,)  # a fresh connection


@pytest.mark.slow
def migrated_runtime(pg, tmp_path):
    """A runtime on the test's own PostgreSQL `pg`, its schema migrated."""
    from runtime import Runtime
    runtime = Runtime(Settings.build(issuer="http://127.0.0.1:8888", database_url=pg.url, var_dir=str(tmp_path / "var"),
                                     keys_dir=str(tmp_path / "keys"), hmac_key="h" * 32))
    runtime.migrate()
    return runtime


def test_held_connections_after_a_restart_readiness_is_truthful_and_threads_reopen(tmp_path):
    """Pool threads keep their connection between units of work (no `SELECT 1` per check-out). After
    PostgreSQL restarts, those connections are dead: `/readyz`'s check must not report the old one,
    and every thread finds its connection dead before using it and opens a fresh one, so none of
    them fails (issue 29: one used to answer a 503 for the restart, and a thread without units of
    work, the scheduler's, failed with `connection already closed` forever)."""
    import threading

    pg = LocalPostgres()
    runtime = None
    try:
        pg.start()
        runtime = migrated_runtime(pg, tmp_path)
        select_one = lambda: runtime.db.execute_sql("SELECT 1").fetchone()  # noqa: E731

        def on_own_thread(fn):
            """Run `fn` on a thread of its own that holds its connection (as a pool thread does)."""
            box, go, done = {}, threading.Event(), threading.Event()

            def body():
                while True:
                    go.wait()
                    go.clear()
                    if box.get("stop"):
                        return
                    try:
                        box["result"] = box["fn"]()
                    except Exception as exc:  # noqa: BLE001 - the test reads it
                        box["result"] = exc
                    done.set()

            thread = threading.Thread(target=body, daemon=True)
            thread.start()

            def call(f):
                box["fn"] = f
                done.clear()
                go.set()
                assert done.wait(30)
                return box["result"]

            call(fn)
            return call, lambda: (box.update(stop=True), go.set())

        assert select_one() == (1,)
        held_ready, stop_ready = on_own_thread(lambda: runtime.unit_of_work(runtime.readiness.report, runtime))
        held_a, stop_a = on_own_thread(lambda: runtime.unit_of_work(select_one))
        held_b, stop_b = on_own_thread(lambda: runtime.unit_of_work(select_one))

        def in_transaction():
            with runtime.db.atomic():  # found dead at BEGIN, before the transaction starts
                return select_one()
        held_c, stop_c = on_own_thread(lambda: runtime.unit_of_work(in_transaction))
        pg.stop()
        pg.start()
        ready, checks = held_ready(lambda: runtime.unit_of_work(runtime.readiness.report, runtime))
        assert ready, checks  # the old connection is dead, the database is not
        assert held_a(lambda: runtime.unit_of_work(select_one)) == (1,)
        assert held_b(lambda: runtime.unit_of_work(select_one)) == (1,)
        assert held_c(lambda: runtime.unit_of_work(in_transaction)) == (1,)
        assert select_one() == (1,)  # this thread's connection (no unit of work, as a loop's) too
        for stop in (stop_ready, stop_a, stop_b, stop_c):
            stop()
    finally:
        if runtime is not None:
            runtime.close()
        pg.stop()


@pytest.mark.slow
def test_a_read_broken_under_it_is_read_again_once_and_a_write_is_not(tmp_path):
    """A statement that cannot have taken effect (a read) is retried once on a fresh connection
    when its connection breaks under it; a write may have committed before the break, so its error
    goes up, and the next statement runs on a fresh connection."""
    import threading

    import peewee
    import psycopg2

    pg = LocalPostgres()
    runtime = admin = None
    try:
        pg.start()
        runtime = migrated_runtime(pg, tmp_path)
        admin = psycopg2.connect(pg.url)
        admin.autocommit = True

        def terminate_when_sleeping(pid: int) -> threading.Thread:
            """Terminate backend `pid` once it is running its pg_sleep (as a failover does mid-statement)."""
            def run():
                cursor = admin.cursor()
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    cursor.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s AND state = 'active' "
                                   "AND query LIKE '%%pg_sleep%%'", (pid,))
                    if cursor.fetchone():
                        cursor.execute("SELECT pg_terminate_backend(%s)", (pid,))
                        return
                    time.sleep(0.01)
            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            return thread

        pid = runtime.db.execute_sql("SELECT pg_backend_pid()").fetchone()[0]
        killer = terminate_when_sleeping(pid)
        answered_by = runtime.db.execute_sql("SELECT pg_backend_pid() FROM pg_sleep(0.3)").fetchone()[0]
        killer.join()
        assert answered_by != pid  # read again, on a fresh connection

        killer = terminate_when_sleeping(answered_by)
        with pytest.raises((peewee.OperationalError, peewee.InterfaceError)):
            runtime.db.execute_sql("INSERT INTO change_version (topic, version) SELECT 'probe', 1 FROM pg_sleep(0.3)")
        killer.join()
        assert runtime.db.execute_sql("SELECT count(*) FROM change_version WHERE topic = 'probe'").fetchone() == (0,)
    finally:
        if admin is not None:
            admin.close()
        if runtime is not None:
            runtime.close()
        pg.destroy()


@pytest.mark.slow
def test_a_bulk_kick_off_the_task_queue_cannot_take_is_a_503_and_leaves_no_export(tmp_path):
    """Redis stops after the FHIR limiter leased this process quota (`ratelimit.leases`), so a kick-off
    passes the limits and commits its job, then cannot queue it. It answered an error and left the
    job `pending`: no client knew its status URL, yet it counted against the app's concurrent exports
    (`SVC_BULK_MAX_CONCURRENT`), so after two such kick-offs the backend got 429 for exports it never
    started, until the sweep had built them for nobody. Now: 503 + Retry-After, and no job is left."""
    from helpers.bulk import Backend
    from lifecycle.organizations import create_organization
    from models.bulk import BulkExport
    from runtime import Runtime
    redis = LocalRedis()
    proc = runtime = None
    try:
        redis.start()
        port = free_port()
        settings = Settings.build(issuer=f"http://127.0.0.1:{port}", database_url=f"sqlite:///{tmp_path / 'svc.db'}",
                                  redis_url=redis.url, var_dir=str(tmp_path / "var"), keys_dir=str(tmp_path / "keys"),
                                  hmac_key="b" * 32, bulk_max_concurrent=1)
        runtime = Runtime(settings)
        runtime.migrate()
        org = create_organization("Queue Clinic", "sandbox", "https://ehr.example/queue")
        proc = start_process(["serve", "--port", str(port)], settings_env(settings), port,
                             log_path=tmp_path / "serve.log")
        client = Backend(runtime, f"http://127.0.0.1:{port}", org).client(org.id)
        for _ in range(8):  # each counter's lease doubles: quota for the next requests, held in the process
            assert client.request("GET", "/Group", headers={"Accept": "application/fhir+json"})[0] == 200
        redis.stop()
        for _ in range(2):
            status, headers, body = client.kick_off("/Patient/$export")
            assert status == 503 and int(headers["Retry-After"]) > 0, (status, body)
            assert body["resourceType"] == "OperationOutcome" and "queue" in body["issue"][0]["diagnostics"], body
        assert BulkExport.select().count() == 0
    finally:
        if proc is not None:
            stop_process(proc)
        if runtime is not None:
            runtime.close()
        redis.destroy()
