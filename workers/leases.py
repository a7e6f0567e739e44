"""Leases of background work: a build holds its row while it runs, and renews it in a thread.

A chart build claims its request (`lease_owner` = its Dramatiq message id, `lease_until`); a
snapshot build stamps its `building` snapshot with a token of its own (`lease_owner`). `LeaseKeeper`
renews the lease every third of it while the work runs; a lease that lapses means the worker died,
and `workers.recovery` re-queues the work. The lease is half of SVC_TASK_RECOVERY_SECONDS.
"""
from __future__ import annotations

import datetime as dt
import logging
import threading

import peewee
from dramatiq.middleware import CurrentMessage

from models.appointments import Snapshot
from models.charts import ChartRequest
from models.schedule import ScheduledRun

log = logging.getLogger("svc_auth.recovery")


def lease_seconds(settings) -> float:
    return settings.task_recovery_seconds / 2


def sweep_interval(settings) -> float:
    return settings.task_recovery_seconds / 4


class LeaseKeeper:
    """Calls `renew()` every `every` seconds in a thread (its own connection to `db`) while the
    `with` block runs. A renewal that updates no row means the work was taken over (its lease
    lapsed: the sweep or another builder has it): the keeper stops and sets `lost`, for the build
    to stop too."""

    def __init__(self, db, renew, every: float):
        self.db, self.renew, self.every = db, renew, every
        self.stop, self.lost = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, name="svc-lease", daemon=True)

    def _run(self) -> None:
        try:
            while not self.stop.wait(self.every):
                try:
                    if not self.renew():
                        log.warning("a lease was lost (the work was taken over): its build stops")
                        self.lost.set()
                        return
                except peewee.PeeweeException:
                    log.exception("could not renew a lease; trying again")
        finally:
            if not self.db.is_closed():
                self.db.close()

    def __enter__(self) -> "LeaseKeeper":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def claim_chart(runtime, request_id: str, owner: str) -> bool:
    """Take the build of a pending request for `owner` (a message id); counts an attempt.

    Succeeds when nobody holds a live lease, or `owner` already does (a retry or redelivery of
    the same message)."""
    now = runtime.clock.now()
    until = now + dt.timedelta(seconds=lease_seconds(runtime.settings))
    return (ChartRequest.update(lease_owner=owner, lease_until=until, attempts=ChartRequest.attempts + 1)
            .where((ChartRequest.id == request_id) & (ChartRequest.status == "pending")
                   & (ChartRequest.lease_until.is_null() | (ChartRequest.lease_until < now)
                      | (ChartRequest.lease_owner == owner)))
            .execute()) == 1


def extend_chart_lease(runtime, request_id: str, owner: str, seconds: float) -> int:
    """Keep `owner`'s lease for `seconds` more (while building, or while a retry waits its backoff)."""
    until = runtime.clock.now() + dt.timedelta(seconds=seconds)
    return (ChartRequest.update(lease_until=until)
            .where((ChartRequest.id == request_id) & (ChartRequest.status == "pending")
                   & (ChartRequest.lease_owner == owner))
            .execute())


def hold_for_retry(runtime, extend, job_id: str, owner: str) -> None:
    """A retry is coming after Dramatiq's backoff: keep `owner`'s lease until then (`extend(runtime,
    job_id, owner, seconds)`: a chart's or an export's), so the sweep does not queue it beside the retry."""
    settings = runtime.settings
    message = CurrentMessage.get_current_message()
    retries = message.options.get("retries", 0) if message is not None else 0
    backoff_ms = min(settings.task_min_backoff_ms * 2 ** (retries + 1), settings.task_max_backoff_ms)
    extend(runtime, job_id, owner, backoff_ms / 1000 + lease_seconds(settings))


def chart_lease_keeper(runtime, request_id: str, owner: str) -> LeaseKeeper:
    lease = lease_seconds(runtime.settings)
    return LeaseKeeper(runtime.db, lambda: extend_chart_lease(runtime, request_id, owner, lease), lease / 3)


def snapshot_held(snapshot: Snapshot):
    """`snapshot`'s `building` row while its build still holds it: the id alone does not tell, as
    SQLite gives a deleted newest row's id to the next row (the next builder's of the night)."""
    return ((Snapshot.id == snapshot.id) & (Snapshot.status == "building")
            & (Snapshot.lease_owner == snapshot.lease_owner))


def extend_snapshot_lease(runtime, snapshot: Snapshot) -> int:
    """Keep the build's lease of its `building` snapshot for a lease more (0: it lost it)."""
    until = runtime.clock.now() + dt.timedelta(seconds=lease_seconds(runtime.settings))
    return Snapshot.update(lease_until=until).where(snapshot_held(snapshot)).execute()


def snapshot_lease_keeper(runtime, snapshot: Snapshot) -> LeaseKeeper:
    return LeaseKeeper(runtime.db, lambda: extend_snapshot_lease(runtime, snapshot), lease_seconds(runtime.settings) / 3)


def sync_job(kind: str, organization_id: str) -> str:
    return f"{kind}:{organization_id}"[:64]


def record_sync_failure(organization_id: str, night: dt.date) -> None:
    """The organization's sync of `night` failed for good: the sweep does not queue it again."""
    ScheduledRun.claim(sync_job("sync-failed", organization_id), night, "worker")
