"""The nightly snapshot: wall time for 1,000 organizations x 20 physicians with 1 and 2 workers.

A scratch PostgreSQL database gets the fleet (bench.fleet) and an active connector session for
every physician; the sandbox EHR connector generates each physician's next 10 days. For each
worker count, that many real `svc-auth worker` processes (Dramatiq on Redis, their own namespace,
default threads) consume the queue; the clock runs from queueing the night's fan-out task
(`workers.snapshot.enqueue_night`, as the scheduler does) until every organization's snapshot of
that night is complete. Each worker count builds a different night, so every run writes a full
night of rows.
"""
from __future__ import annotations

import datetime as dt
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.fleet import copy_rows, redis_namespace, scratch_database, seed_fleet
from bench.service import BenchService

ROOT = Path(__file__).resolve().parent.parent
ORGANIZATIONS = 1000
PHYSICIANS = 20
FIRST_NIGHT = dt.date(2026, 3, 2)  # a Monday: the 10 days ahead hold 8 clinic days


def _wait_ready(log_path: Path, count: int, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if log_path.read_text(errors="replace").count("worker consuming") >= count:
            return
        time.sleep(0.1)
    raise TimeoutError(f"workers did not start: {log_path.read_text()[-2000:]}")


def snapshot_benchmarks(postgres_url: str, redis_url: str, say, worker_counts=(1, 2), timeout: float = 3600) -> dict:
    from conf import Settings
    from runtime import Runtime
    from models.appointments import ConnectorSession, Snapshot, SnapshotAppointment
    from workers.snapshot import enqueue_night, night_window, organizations_to_sync

    namespace = f"svc-bench-{secrets.token_hex(4)}"
    runs = []
    with scratch_database(postgres_url) as url, redis_namespace(redis_url, namespace):
        service = BenchService(url, extra_env={"SVC_REDIS_URL": redis_url, "SVC_REDIS_NAMESPACE": namespace})
        service.seed()
        settings = Settings.from_env(service.env, dotenv=None)
        runtime = Runtime(settings)
        try:
            now = runtime.clock.now()
            fleet = seed_fleet(runtime.db, service.application_id, ORGANIZATIONS, PHYSICIANS, now)
            nights = [FIRST_NIGHT + dt.timedelta(days=7 * i) for i in range(len(worker_counts))]
            first_start, _ = night_window(settings, nights[0])
            last_start, _ = night_window(settings, nights[-1])
            copy_rows(runtime.db, ConnectorSession, ["user_id", "started_at", "last_seen_at", "ended_at"],
                      ((u[0], first_start - dt.timedelta(hours=1), last_start, None)
                       for physicians in fleet.values() for u in physicians))
            runtime.db.execute_sql("VACUUM ANALYZE")
            expected = len(organizations_to_sync())  # the fleet, and the seeded application's own clinic
            say(f"snapshot: {ORGANIZATIONS} organizations x {PHYSICIANS} physicians seeded "
                f"(PostgreSQL, Redis namespace {namespace})")
            for workers, night in zip(worker_counts, nights):
                log_path = service.tmp / f"workers-{workers}.log"
                log = open(log_path, "wb")
                procs = [subprocess.Popen([sys.executable, "-m", "cli.__main__", "worker"], env=service.env,
                                          cwd=str(ROOT), stdout=log, stderr=subprocess.STDOUT)
                         for _ in range(workers)]
                try:
                    _wait_ready(log_path, workers)
                    started = time.monotonic()
                    enqueue_night(runtime, night)
                    done = 0
                    while time.monotonic() - started < timeout:
                        done = Snapshot.select().where((Snapshot.snapshot_date == night)
                                                       & (Snapshot.status == "complete")).count()
                        if done >= expected:
                            break
                        if any(p.poll() is not None for p in procs):
                            raise RuntimeError(f"a worker exited: {log_path.read_text()[-2000:]}")
                        time.sleep(0.25)
                    seconds = time.monotonic() - started
                    if done < expected:
                        raise TimeoutError(f"only {done} snapshots after {timeout} s")
                    rows = (SnapshotAppointment.select().join(Snapshot)
                            .where(Snapshot.snapshot_date == night).count())
                finally:
                    for p in procs:
                        p.send_signal(signal.SIGTERM)
                    for p in procs:
                        p.wait(60)
                    log.close()
                run = {"workers": workers, "threads_per_worker": settings.worker_threads, "night": night.isoformat(),
                       "seconds": round(seconds, 1), "snapshots": done, "rows": rows,
                       "rows_per_second": round(rows / seconds), "organizations_per_second": round(done / seconds, 1)}
                runs.append(run)
                say(f"snapshot night with {workers} worker(s) x {settings.worker_threads} threads: {seconds:.1f} s "
                    f"for {done} organizations, {rows:,} appointments ({run['rows_per_second']:,} rows/s)")
        finally:
            runtime.close()
    return {"organizations": ORGANIZATIONS, "physicians_per_organization": PHYSICIANS, "runs": runs,
            "cores": os.cpu_count()}
