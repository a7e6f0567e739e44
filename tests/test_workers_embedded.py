"""The embedded default: `svc-auth serve` without Redis runs the scheduler and the worker itself."""
from __future__ import annotations

import datetime as dt
import time
import urllib.request

from workers.activity import record_activity
from lifecycle.verification import record_platform_verification
from models.appointments import Snapshot, SnapshotAppointment
from models.schedule import ScheduledRun
from workers.retention import JOB as RETENTION_JOB

from helpers.processes import free_port, settings_env, start_process, stop_process


def wait_for_http(url: str, timeout: float = 20.0) -> None:
    """The port opens before the app is ready: wait until it answers."""
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.05)


def test_serve_schedules_and_builds_the_night_in_process(runtime, world, settings, tmp_path, clock):
    record_platform_verification(runtime, world.app, world.physician)
    record_activity(runtime, world.physician)
    now = clock.now()
    window = f"{(now - dt.timedelta(minutes=1)):%H:%M}-{(now + dt.timedelta(minutes=30)):%H:%M}"
    env = settings_env(settings, SVC_SYNC_WINDOW=window)
    procs = []
    for n in range(2):  # two serve processes on one database, as behind a proxy
        port = free_port()
        procs.append(start_process(["serve", "--port", str(port)], env, port, log_path=tmp_path / f"serve{n}.log"))
        wait_for_http(f"http://127.0.0.1:{port}/.well-known/openid-configuration")
    try:
        deadline = time.time() + 40
        while time.time() < deadline and not Snapshot.latest_complete(world.org.id):
            time.sleep(0.1)
        snapshot = Snapshot.latest_complete(world.org.id)
        assert snapshot is not None, (tmp_path / "serve0.log").read_text()[-3000:]
        assert SnapshotAppointment.select().where(SnapshotAppointment.snapshot == snapshot.id).count() > 0
        assert ScheduledRun.select().where(ScheduledRun.job != RETENTION_JOB).count() == 1  # two processes, one claim
        assert ScheduledRun.select().where(ScheduledRun.job == RETENTION_JOB).count() == 1  # and one retention sweep
    finally:
        for proc in procs:
            assert stop_process(proc) == 0
