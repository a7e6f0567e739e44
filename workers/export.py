"""Bulk Data exports on the task workers: the `build_export` task, its lease, and the sweep.

As a chart build (`workers.charts`): the kick-off creates a pending `BulkExport`, commits, then
queues `build_export`. The task claims the job's lease (its message id), renews it while it
writes (`workers.leases.LeaseKeeper`) and keeps it while a retry waits for its backoff
(`workers.leases.hold_for_retry`: the sweep does not queue a second delivery beside the retry);
each finished file is recorded as it is stored (`bulk.build`), each finished type is marked done.
A worker killed mid-export stops renewing; `sweep_exports` (part of every recovery sweep,
`workers.recovery.sweep`) re-queues the job, whose next delivery drops the files of the
unfinished type and goes on from there; a job whose tries are used up is failed. A job DELETEd
while built (`cancelled`) keeps its lease renewed until its build stops (it checks before each
EHR search, at most every 50 ms) and removes it. The sweep also deletes expired exports (their
objects, then their rows) and cancelled ones whose worker died, and aborts unfinished uploads
under `bulk/` that no live delivery is writing.
"""
from __future__ import annotations

import datetime as dt
import logging
import secrets

from dramatiq.middleware import CurrentMessage

from bulk.build import ExportGone, build_export as build, delete_export, forget_cancelled, mark_failed
from bulk.files import EXPORT_PREFIX
from connectors import BoundExceeded, ConnectorError, ConnectorUnavailable
from errors import ApiError
from models.bulk import BulkExport
from models.db import DATABASE_ERRORS
from workers.leases import LeaseKeeper, hold_for_retry, lease_seconds
from workers.tasks import task

log = logging.getLogger("svc_auth.bulk")


def claim_export(runtime, export_id: str, owner: str) -> bool:
    """Take the build of a pending job for `owner` (a message id); counts an attempt."""
    now = runtime.clock.now()
    until = now + dt.timedelta(seconds=lease_seconds(runtime.settings))
    return (BulkExport.update(lease_owner=owner, lease_until=until, attempts=BulkExport.attempts + 1)
            .where((BulkExport.id == export_id) & (BulkExport.status == "pending")
                   & (BulkExport.lease_until.is_null() | (BulkExport.lease_until < now)
                      | (BulkExport.lease_owner == owner)))
            .execute()) == 1


def extend_export_lease(runtime, export_id: str, owner: str, seconds: float) -> int:
    """Renew `owner`'s lease, a cancelled job's too: it counts against the app's exports until its build stops."""
    until = runtime.clock.now() + dt.timedelta(seconds=seconds)
    return (BulkExport.update(lease_until=until)
            .where((BulkExport.id == export_id) & BulkExport.status.in_(("pending", "cancelled"))
                   & (BulkExport.lease_owner == owner))
            .execute())


def export_lease_keeper(runtime, export_id: str, owner: str) -> LeaseKeeper:
    lease = lease_seconds(runtime.settings)
    return LeaseKeeper(runtime.db, lambda: extend_export_lease(runtime, export_id, owner, lease), lease / 3)


def run_export(runtime, export_id: str, owner: str | None = None) -> None:
    """Build a pending export under its lease (a direct call gets a one-off owner). Safe to run again."""
    owner = owner or f"direct-{secrets.token_hex(8)}"
    job = BulkExport.get_or_none(BulkExport.id == export_id)
    if job is not None and job.status == "cancelled":
        forget_cancelled(runtime, export_id, owner)  # DELETEd after the sweep gave it to this message
    if job is None or job.status != "pending":
        return
    if not claim_export(runtime, export_id, owner):
        log.info("export %s: another delivery holds its lease", export_id)
        return
    with export_lease_keeper(runtime, export_id, owner):
        try:
            build(runtime, export_id, owner)
        finally:  # DELETEd while built: gone now that the build stopped, however it stopped
            forget_cancelled(runtime, export_id, owner)


@task(queue_name="exports")
def build_export(runtime, export_id: str) -> None:
    message = CurrentMessage.get_current_message()
    owner = message.message_id if message is not None else None
    try:
        run_export(runtime, export_id, owner)
    except ExportGone:
        log.info("export %s: deleted or taken over while it was built", export_id)
    except ApiError as exc:  # e.g. its Group is gone
        mark_failed(runtime, export_id, exc.message, exc.status)
    except ConnectorUnavailable as exc:
        if runtime.task_queue.last_attempt():  # the EHR's host goes to the log only, as the FHIR API's (fhir_api.api)
            log.error("export %s: the EHR did not answer through every try: %s", export_id, exc)
            mark_failed(runtime, export_id, "The clinic's EHR did not answer through every try; start the export "
                                            "again later.", 503)
            return
        hold_for_retry(runtime, extend_export_lease, export_id, owner)
        raise
    except BoundExceeded as exc:
        log.error("export %s: the EHR went past a bound: %s", export_id, exc)
        mark_failed(runtime, export_id, "The clinic's EHR answered beyond what svc-auth accepts.", 502)
    except ConnectorError as exc:
        log.error("export %s: the EHR failed: %s", export_id, exc)
        mark_failed(runtime, export_id, "The clinic's EHR refused svc-auth's request.", 502)
    except Exception:
        log.exception("export %s: build failed", export_id)
        if runtime.task_queue.last_attempt():
            mark_failed(runtime, export_id, "The export could not be built.", 500)
            return
        hold_for_retry(runtime, extend_export_lease, export_id, owner)
        raise


def enqueue_export(runtime, export_id: str) -> None:
    """Queue the build of a committed, pending export (the kick-off calls this)."""
    runtime.task_queue.send(build_export, export_id)


# -- the sweep ---------------------------------------------------------------------------------

def _stale(now: dt.datetime, lease: float):
    return ((BulkExport.status == "pending")
            & ((BulkExport.lease_until.is_null() & (BulkExport.created_at < now - dt.timedelta(seconds=lease)))
               | (BulkExport.lease_until < now)))


def requeue_stale_exports(runtime) -> list[str]:
    """Re-queue (or fail, past its tries) each pending export nobody is building."""
    settings = runtime.settings
    now, lease = runtime.clock.now(), lease_seconds(settings)
    requeued = []
    for job in BulkExport.select(BulkExport.id, BulkExport.attempts).where(_stale(now, lease)):
        if job.attempts > settings.task_max_retries:
            mark_failed(runtime, job.id, f"The export could not be built: its worker stopped {job.attempts} times.")
            continue
        message = runtime.task_queue.message(build_export, job.id)
        claimed = (BulkExport.update(lease_owner=message.message_id, lease_until=now + dt.timedelta(seconds=lease))
                   .where((BulkExport.id == job.id) & _stale(now, lease)).execute())
        if claimed:
            runtime.task_queue.send_message(message)
            requeued.append(job.id)
    if requeued:
        log.warning("re-queued %d export(s) whose worker stopped: %s", len(requeued), ", ".join(requeued))
    return requeued


class ExportsKept(Exception):
    """Expired exports whose files or rows could not be deleted this sweep (each logged)."""


def delete_expired_exports(runtime) -> list[str]:
    """Delete the exports past their expiry, and the cancelled ones whose build's lease lapsed,
    oldest first, each whatever happened to the others: one whose files the store will not delete
    is logged and kept for the next sweep (ExportsKept once the rest are done), never holding back
    the exports after it."""
    now = runtime.clock.now()
    expired = [job.id for job in BulkExport.select(BulkExport.id).where(
        ((BulkExport.status != "pending") & (BulkExport.expires_at < now))
        | ((BulkExport.status == "cancelled") & (BulkExport.lease_until.is_null() | (BulkExport.lease_until < now))))
        .order_by(BulkExport.expires_at.asc(nulls="first"), BulkExport.id)]
    deleted, kept = [], []
    for export_id in expired:
        try:
            delete_export(runtime, export_id)
        except DATABASE_ERRORS:
            raise  # the sweep's connection is dropped (models.db.HeldConnections); nothing else would go
        except Exception:
            log.exception("expired export %s could not be deleted; the next sweep tries again", export_id)
            kept.append(export_id)
        else:
            deleted.append(export_id)
    if deleted:
        log.info("deleted %d expired export(s)", len(deleted))
    if kept:
        raise ExportsKept(f"{len(kept)} expired export(s) kept: {', '.join(kept)}")
    return deleted


def abort_stale_uploads(runtime) -> list[str]:
    """Abort unfinished uploads under `bulk/` of exports no live delivery is building."""
    store, now = runtime.batch_object_store, runtime.clock.now()
    live = {job.id for job in BulkExport.select(BulkExport.id).where(
        BulkExport.status.in_(("pending", "cancelled")) & (BulkExport.lease_until >= now))}
    aborted = []
    for upload in list(store.unfinished_uploads(EXPORT_PREFIX)):
        key = upload.key
        if key is None or not key.startswith(EXPORT_PREFIX):
            continue  # an older version's staging object: the chart sweep's (workers.recovery.sweep_uploads)
        if key[len(EXPORT_PREFIX):].split("/", 1)[0] in live:
            continue
        store.abort_upload(upload)
        aborted.append(key)
    if aborted:
        log.warning("aborted %d unfinished export upload(s): %s", len(aborted), ", ".join(aborted))
    return aborted


def sweep_exports(runtime) -> None:
    requeue_stale_exports(runtime)
    delete_expired_exports(runtime)
    abort_stale_uploads(runtime)
