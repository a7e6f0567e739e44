"""A night's organization whose sync never started (its message was lost with a dead worker, or
the scheduler died between claiming the night and queuing it) is queued again once the night's
window has ended; one that failed for good is left alone. Embedded task queue, real database."""
from __future__ import annotations

import datetime as dt
import time

from workers.activity import record_activity
from lifecycle.applications import install_application
from lifecycle.organizations import create_organization
from lifecycle.verification import record_platform_verification
from models.appointments import Snapshot
from models.schedule import ScheduledRun
from workers.leases import record_sync_failure
from workers.recovery import _retry_budget, sweep_unstarted_nights
from workers.snapshot import NIGHTLY_JOB, build_snapshot, night_window

NIGHT = dt.date(2030, 3, 4)


def move_clock_to(clock, when: dt.datetime) -> None:
    clock.offset = 0.0
    clock.advance((when - clock.now()).total_seconds())


def wait_for_snapshot(org_id: str, night: dt.date) -> Snapshot:
    deadline = time.time() + 30
    while time.time() < deadline:
        snapshot = Snapshot.latest_complete(org_id)
        if snapshot is not None and snapshot.snapshot_date == night:
            return snapshot
        time.sleep(0.05)
    raise AssertionError(f"no snapshot of {org_id} for {night}")


def test_an_organization_whose_night_never_started_is_queued_again_after_the_window(runtime, world):
    settings = runtime.settings
    start, end = night_window(settings, NIGHT)
    move_clock_to(runtime.clock, start - dt.timedelta(hours=6))
    record_platform_verification(runtime, world.app, world.physician)
    record_activity(runtime, world.physician)
    done = create_organization("Done Clinic", "sandbox")
    install_application(world.app.id, done.id)
    failed = create_organization("Failed Clinic", "sandbox")
    install_application(world.app.id, failed.id)
    assert ScheduledRun.claim(NIGHTLY_JOB, NIGHT, "scheduler")   # claimed; then the fan-out was lost

    move_clock_to(runtime.clock, start + dt.timedelta(minutes=5))
    build_snapshot(runtime, done.id, NIGHT)
    record_sync_failure(failed.id, NIGHT)
    assert sweep_unstarted_nights(runtime) == []      # the window is still open: the queue may be long

    move_clock_to(runtime.clock, end + dt.timedelta(minutes=1))
    assert sweep_unstarted_nights(runtime) == [(world.org.id, NIGHT)]
    wait_for_snapshot(world.org.id, NIGHT)
    assert sweep_unstarted_nights(runtime) == []      # every organization has its night now

    # Lost again: queued again only once Dramatiq's own retries would be over.
    Snapshot.delete().where(Snapshot.organization == world.org.id).execute()
    assert sweep_unstarted_nights(runtime) == []
    runtime.clock.advance(_retry_budget(settings) + 1)
    assert sweep_unstarted_nights(runtime) == [(world.org.id, NIGHT)]
    wait_for_snapshot(world.org.id, NIGHT)
