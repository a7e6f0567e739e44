"""The scheduler: queue the nightly appointment sync once per day, at the start of SVC_SYNC_WINDOW.

Any number of schedulers may run (for availability): each night is claimed by inserting a unique
(`nightly-sync`, date) row, so exactly one of them queues it. A scheduler that is down for the
whole window misses that night (`svc-auth snapshot run --date` catches up).
"""
from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading

from models.schedule import ScheduledRun
from workers.loops import run_every, run_steps
from workers.recovery import SWEEP_STEPS
from workers.retention import retention_due
from workers.snapshot import NIGHTLY_JOB, enqueue_night, night_window

log = logging.getLogger("svc_auth.scheduler")

JOB = NIGHTLY_JOB


def night_due(settings, now: dt.datetime) -> dt.date | None:
    """The night whose sync window contains `now` (today's, or yesterday's past midnight)."""
    for night in (now.date(), now.date() - dt.timedelta(days=1)):
        start, end = night_window(settings, night)
        if start <= now < end:
            return night
    return None


def tick(runtime, now: dt.datetime | None = None) -> dt.date | None:
    """Queue tonight's sync if its window is open and no scheduler did yet; returns the night queued."""
    night = night_due(runtime.settings, now or runtime.clock.now())
    if night is None or not ScheduledRun.claim(JOB, night, f"{socket.gethostname()}:{os.getpid()}"):
        return None
    try:
        enqueue_night(runtime, night)
    except Exception:
        # Give the night back so this or another scheduler queues it on its next tick.
        ScheduledRun.delete().where((ScheduledRun.job == JOB) & (ScheduledRun.run_date == night)).execute()
        raise
    log.info("queued the nightly sync of %s", night)
    return night


def tick_and_sweep(runtime) -> None:
    """Tonight's sync, the recovery sweep's steps (the work of workers that died: workers.recovery),
    then, once a day, retention (workers.retention): each whatever the others did."""
    run_steps(runtime, (tick, *SWEEP_STEPS, retention_due), log)


def run_scheduler(runtime, stop: threading.Event, interval: float = 30.0) -> None:
    """Tick every `interval` seconds until `stop` is set; a failed tick (database or Redis away) is
    logged and tried again, on a fresh connection (workers.loops)."""
    run_every(runtime, stop, interval, tick_and_sweep, "scheduler tick", log)


def start_scheduler_thread(runtime, interval: float = 30.0) -> threading.Event:
    """Run the scheduler in a daemon thread (embedded default, inside `serve`); set the event to stop."""
    stop = threading.Event()
    threading.Thread(target=run_scheduler, args=(runtime, stop, interval), name="svc-scheduler", daemon=True).start()
    return stop
