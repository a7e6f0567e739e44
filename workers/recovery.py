"""Recovery: every accepted chart request and every started snapshot ends, even if its worker dies.

Work is leased. A chart build claims its request (`lease_owner` = its Dramatiq message id,
`lease_until` = now + the lease) and a snapshot build stamps its `building` snapshot; a thread
renews the lease while the work runs (`LeaseKeeper`). A worker killed mid-task stops renewing, so
its lease lapses. The sweep (`sweep`), run by every `svc-auth worker` and by the scheduler, then:

- re-queues each `pending` chart request whose lease lapsed, or that was never started within a
  lease (its message was fetched by a worker that died, or lost), handing the lease to the new
  message so exactly one delivery builds it; a request whose tries are used up becomes `failed`;
- deletes each `building` snapshot whose lease lapsed and re-queues its organization's night,
  unless that night (or a later one) is already complete;
- once a recent night's sync window has ended, queues again each organization with no snapshot of
  that night (its message was lost before it started), unless its sync failed for good;
- aborts each unfinished upload in the object store whose build no longer holds a live lease (a
  multipart upload or temporary file of a killed writer), and removes older versions' staging
  objects, so the store holds exactly one object per ready request and nothing else;
- deletes the ZIP of each chart ready for longer than SVC_CHART_TTL (`expire_charts`): a patient's
  chart is not kept in the store once its app has had the time to fetch it.
- deletes the ZIP of each failed or expired request that still names one (`discard_archives`): the
  store was down when the request ended, so its delete failed then.

With the lease at half of SVC_TASK_RECOVERY_SECONDS, renewed every sixth, and a sweep every
quarter, a dead worker's work is re-queued within SVC_TASK_RECOVERY_SECONDS. Builds are idempotent
(one object key per request; a night's publish replaces that night), so a duplicate delivery never
makes a second object or a second snapshot.
"""
from __future__ import annotations

import datetime as dt
import logging
import threading

from models.appointments import Snapshot, SnapshotAppointment
from models.charts import ChartRequest
from models.schedule import ScheduledRun
from storage.uploads import UnfinishedUpload
from workers.charts import CHART_PREFIX, ENDED, build_chart, chart_key, forget_archive, mark_failed
from workers.export import sweep_exports
from workers.loops import run_every, run_steps
from workers.leases import lease_seconds, sweep_interval, sync_job
from workers.snapshot import NIGHTLY_JOB, night_window, organizations_to_sync, sync_organization

log = logging.getLogger("svc_auth.recovery")


# -- chart requests ---------------------------------------------------------------------------

def _stale_chart(now: dt.datetime, lease: float):
    return ((ChartRequest.status == "pending")
            & ((ChartRequest.lease_until.is_null() & (ChartRequest.created_at < now - dt.timedelta(seconds=lease)))
               | (ChartRequest.lease_until < now)))


def sweep_charts(runtime) -> list[str]:
    """Re-queue (or fail, when its tries are used up) each pending request nobody is working on."""
    settings = runtime.settings
    now, lease = runtime.clock.now(), lease_seconds(settings)
    requeued = []
    for request in ChartRequest.select(ChartRequest.id, ChartRequest.attempts).where(_stale_chart(now, lease)):
        if request.attempts > settings.task_max_retries:
            mark_failed(runtime, request.id, f"The chart archive could not be built: its worker stopped "
                                             f"{request.attempts} times.")
            continue
        message = runtime.task_queue.message(build_chart, request.id)
        claimed = (ChartRequest.update(lease_owner=message.message_id,
                                       lease_until=now + dt.timedelta(seconds=lease))
                   .where((ChartRequest.id == request.id) & _stale_chart(now, lease)).execute())
        if claimed:  # several sweepers may look at once: only the one that claimed re-queues
            runtime.task_queue.send_message(message)
            requeued.append(request.id)
    if requeued:
        log.warning("re-queued %d chart request(s) whose worker stopped: %s", len(requeued), ", ".join(requeued))
    return requeued


# -- snapshots --------------------------------------------------------------------------------

def sweep_snapshots(runtime) -> list[tuple[str, dt.date]]:
    """Remove each `building` snapshot whose worker stopped, and re-queue its night if still needed."""
    now, lease = runtime.clock.now(), lease_seconds(runtime.settings)
    stale = ((Snapshot.status == "building")
             & ((Snapshot.lease_until.is_null() & (Snapshot.started_at < now - dt.timedelta(seconds=lease)))
                | (Snapshot.lease_until < now)))
    requeued = []
    for snapshot in Snapshot.select().where(stale):
        with runtime.db.atomic():
            SnapshotAppointment.delete().where(
                SnapshotAppointment.snapshot.in_(Snapshot.select(Snapshot.id).where((Snapshot.id == snapshot.id) & stale))
            ).execute()
            if not Snapshot.delete().where((Snapshot.id == snapshot.id) & stale).execute():
                continue  # another sweeper took it, or its worker came back and published it
        done = Snapshot.select().where((Snapshot.organization == snapshot.organization_id)
                                       & (Snapshot.status == "complete")
                                       & (Snapshot.snapshot_date >= snapshot.snapshot_date)).exists()
        if not done:
            runtime.task_queue.send(sync_organization, snapshot.organization_id, snapshot.snapshot_date.isoformat())
            requeued.append((snapshot.organization_id, snapshot.snapshot_date))
    if requeued:
        log.warning("re-queued %d snapshot(s) whose worker stopped: %s", len(requeued), requeued)
    return requeued


def _retry_budget(settings) -> float:
    """Seconds Dramatiq may spend retrying one task with backoff, plus a lease."""
    backoffs = sum(min(settings.task_min_backoff_ms * 2 ** k, settings.task_max_backoff_ms)
                   for k in range(1, settings.task_max_retries + 1))
    return backoffs / 1000 + lease_seconds(settings)


def sweep_unstarted_nights(runtime) -> list[tuple[str, dt.date]]:
    """Queue again each organization that has no snapshot of a recent night once its window ended.

    Covers what has no snapshot row to lease: a fan-out or `sync_organization` message lost with a
    dead worker (or a scheduler killed between claiming the night and queuing it). An organization
    whose sync failed for good (`record_sync_failure`) is left alone, and one is queued again at
    most once per retry budget (while Dramatiq may still be retrying it)."""
    settings = runtime.settings
    now = runtime.clock.now()
    nights = [r.run_date for r in ScheduledRun.select(ScheduledRun.run_date).where(
        (ScheduledRun.job == NIGHTLY_JOB) & (ScheduledRun.run_date >= now.date() - dt.timedelta(days=1)))]
    nights = [night for night in nights if now >= night_window(settings, night)[1]]  # else its queue may just be long
    organizations = organizations_to_sync() if nights else []
    requeued = []
    for night in nights:
        seen = {row.organization_id for row in
                Snapshot.select(Snapshot.organization).where(Snapshot.snapshot_date >= night).distinct()}
        failed = {row.job for row in ScheduledRun.select(ScheduledRun.job).where(
            (ScheduledRun.run_date == night) & ScheduledRun.job.startswith(sync_job("sync-failed", "")))}
        for org_id in organizations:
            if org_id in seen or sync_job("sync-failed", org_id) in failed:
                continue
            if _claim_requeue(sync_job("sync-requeued", org_id), night, now, _retry_budget(settings)):
                runtime.task_queue.send(sync_organization, org_id, night.isoformat())
                requeued.append((org_id, night))
    if requeued:
        log.warning("queued %d organization(s) again whose night never started: %s", len(requeued), requeued)
    return requeued


def _claim_requeue(job: str, night: dt.date, now: dt.datetime, every: float) -> bool:
    """True for one caller per `every` seconds for (job, night), however many sweepers race."""
    if ScheduledRun.claim(job, night, "recovery", now):
        return True
    return (ScheduledRun.update(claimed_at=now)
            .where((ScheduledRun.job == job) & (ScheduledRun.run_date == night)
                   & (ScheduledRun.claimed_at < now - dt.timedelta(seconds=every))).execute()) == 1


CHART_EXPIRED = "The chart's archive was deleted SVC_CHART_TTL after it was built; request the chart again."
EXPIRE_BATCH = 200
"""Archives one sweep deletes at most, oldest first: a backlog (the first sweep after an upgrade)
goes over several sweeps, and never holds up the sweep's other work for long."""


def expire_charts(runtime) -> list[str]:
    """Delete the archive of each request ready since before SVC_CHART_TTL ago (at most EXPIRE_BATCH,
    oldest first); the request becomes `expired`. The object goes first: a sweep that stops between
    the two deletes it again (a delete of an absent object succeeds), and the request is never
    `expired` with its chart kept."""
    cut = runtime.clock.now() - dt.timedelta(seconds=runtime.settings.chart_ttl)
    expired = []
    for request in ChartRequest.select(ChartRequest.id, ChartRequest.object_key).where(
            (ChartRequest.status == "ready") & (ChartRequest.ready_at < cut)).order_by(
            ChartRequest.ready_at).limit(EXPIRE_BATCH):
        if request.object_key:
            runtime.batch_object_store.delete(request.object_key)
        if (ChartRequest.update(status="expired", object_key=None, error=CHART_EXPIRED)
                .where((ChartRequest.id == request.id) & (ChartRequest.status == "ready")).execute()):
            expired.append(request.id)
    if expired:
        log.info("deleted the archives of %d chart(s) past SVC_CHART_TTL: %s", len(expired), ", ".join(expired))
    return expired


def discard_archives(runtime) -> list[str]:
    """Delete the archive of each failed or expired request that still names one (`object_key`: its
    delete failed then, the object store down; at most EXPIRE_BATCH, oldest first), so no ZIP of an
    ended request outlives the store's outage by more than a sweep."""
    discarded = []
    for request in ChartRequest.select(ChartRequest.id, ChartRequest.object_key).where(
            ChartRequest.status.in_(ENDED) & ChartRequest.object_key.is_null(False)).order_by(
            ChartRequest.created_at).limit(EXPIRE_BATCH):
        runtime.batch_object_store.delete(request.object_key)
        forget_archive(request.id, request.object_key)
        discarded.append(request.id)
    if discarded:
        log.info("deleted the archives of %d ended chart request(s) left by an object store outage: %s",
                 len(discarded), ", ".join(discarded))
    return discarded


# -- unfinished uploads -----------------------------------------------------------------------

def _upload_is_live(upload: UnfinishedUpload, live_keys: set[str], now: dt.datetime, grace: float) -> bool:
    """A chart's upload lives while its build holds a live lease; anything else gets `grace`
    seconds from its start (a test-mode archive, or an older version's staging object)."""
    if upload.key is not None and upload.key.startswith(CHART_PREFIX) and upload.key.count("/") == 1:
        return upload.key in live_keys
    return upload.started > now - dt.timedelta(seconds=grace)


def sweep_uploads(runtime) -> list[str]:
    """Abort the object store's unfinished uploads that no live build is writing; returns their keys."""
    store = runtime.batch_object_store
    now = runtime.clock.now()
    live_keys = {chart_key(r.id) for r in ChartRequest.select(ChartRequest.id).where(
        (ChartRequest.status == "pending") & (ChartRequest.lease_until >= now))}
    wall_now, grace = dt.datetime.utcnow(), lease_seconds(runtime.settings)  # upload times are the store's clock
    aborted = []
    for upload in list(store.unfinished_uploads(CHART_PREFIX)):
        if not _upload_is_live(upload, live_keys, wall_now, grace):
            store.abort_upload(upload)
            aborted.append(upload.key or upload.handle[-1])
    if aborted:
        log.warning("aborted %d unfinished upload(s) of stopped writers: %s", len(aborted), ", ".join(aborted))
    return aborted


SWEEP_STEPS = (sweep_charts, sweep_snapshots, sweep_unstarted_nights, sweep_uploads, expire_charts, discard_archives,
               sweep_exports)  # Bulk Data exports: re-queued, expired, their stale uploads (workers.export)
"""A recovery sweep's steps, each run whatever the others did (`workers.loops.run_steps`)."""


def sweep(runtime) -> None:
    run_steps(runtime, SWEEP_STEPS, log)


def run_recovery(runtime, stop: threading.Event, interval: float | None = None) -> None:
    """Sweep every `interval` seconds (default a quarter of SVC_TASK_RECOVERY_SECONDS) until `stop`;
    a failed sweep is logged and tried again, on a fresh connection (workers.loops)."""
    run_every(runtime, stop, interval or sweep_interval(runtime.settings), sweep, "recovery sweep", log,
              at_once=False)


def start_recovery_thread(runtime) -> threading.Event:
    """Sweep in a daemon thread (each `svc-auth worker`); set the returned event to stop."""
    stop = threading.Event()
    threading.Thread(target=run_recovery, args=(runtime, stop), name="svc-recovery", daemon=True).start()
    return stop
