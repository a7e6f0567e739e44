"""The embedded default: `svc-auth serve` without Redis runs the scheduler and the worker itself."""
from __future__ import annotations

import datetime as dt
import time

from connectors.sessions import touch_session
from lifecycle.verification import record_platform_verification
from models.appointments import Snapshot, SnapshotAppointment
from models.clock import clock
from models.schedule import ScheduledRun

from conftest import free_port, settings_env, start_process, stop_process


def test_serve_schedules_and_builds_the_night_in_process(runtime, world, settings, tmp_path):
    record_platform_verification(world["app"], world["physician"])
    touch_session(world["physician"])
    now = clock.now()
    window = f"{(now - dt.timedelta(minutes=1)):%H:%M}-{(now + dt.timedelta(minutes=30)):%H:%M}"
    port = free_port()
    procs = [start_process(["serve", "--port", str(port), "--processes", "2"],
                           settings_env(settings, SVC_SYNC_WINDOW=window), port, log_path=tmp_path / "serve.log")]
    try:
        deadline = time.time() + 40
        while time.time() < deadline and not Snapshot.latest_complete(world["org"].id):
            time.sleep(0.1)
        snapshot = Snapshot.latest_complete(world["org"].id)
        assert snapshot is not None, (tmp_path / "serve.log").read_text()[-3000:]
        assert SnapshotAppointment.select().where(SnapshotAppointment.snapshot == snapshot.id).count() > 0
        assert ScheduledRun.select().count() == 1  # two processes, one claim
    finally:
        for proc in procs:
            stop_process(proc)
