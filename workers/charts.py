"""Chart retrieval: build the encrypted ZIP of a `ChartRequest` and store it.

The REST API creates a `ChartRequest` (status `pending`), commits, then calls
`enqueue_chart_build(runtime, request_id)`. The `build_chart` task fetches the chart from the
organization's connector, writes the archive to a temporary directory, stores it (the store makes
it visible only when complete), checks it is there, and only then marks the request `ready`.
A worker killed on the way leaves the request `pending` and re-running it yields one object.
Outages are retried with backoff; when retries run out, or for permanent errors, the request is
marked `failed` with a reason the API shows. Builds are leased and a stopped worker's requests are
re-queued by the sweep (workers.recovery), so every request ends `ready` or `failed`, once.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import logging
import secrets
import tempfile

from dramatiq.middleware import CurrentMessage

from audit.disclosures import ehr_recorder
from connectors import Bounds, ConnectorError, ConnectorUnavailable, connector_for
from connectors.sandbox import SandboxConnector, patient_panel
from models.charts import ChartRequest
from workers.tasks import task
from workers.chart_archive import write_chart_zip, zip_password
from workers.leases import chart_lease_keeper, claim_chart, extend_chart_lease, hold_for_retry

log = logging.getLogger("svc_auth.charts")

TEST_REQUEST_ID = "a1b2c3d4e5f6a7b8c9d0"
TEST_ORGANIZATION = "123456789"
TEST_CREATED = dt.datetime(2024, 1, 1)


CHART_PREFIX = "charts/"


def chart_key(request_id: str) -> str:
    return f"{CHART_PREFIX}{request_id}.zip"


def build_chart_archive(runtime, request_id: str, owner: str | None = None) -> ChartRequest | None:
    """Build and store the ZIP of a pending request, then mark it ready. Safe to run again.

    The build is leased to `owner` (the task's message id; a direct call gets a one-off id) and
    the lease is renewed while it runs (workers.recovery); a request another delivery is building
    right now is left to it."""
    request = ChartRequest.get_or_none(ChartRequest.id == request_id)
    if request is None or request.status != "pending":
        return request  # gone, or already done by an earlier delivery of the same task
    owner = owner or f"direct-{secrets.token_hex(8)}"
    if not claim_chart(runtime, request_id, owner):
        log.info("chart %s: another delivery holds its lease", request_id)
        return request
    with chart_lease_keeper(runtime, request_id, owner):
        recorder = ehr_recorder(runtime, request.organization_id, request.application_id,
                                request.application.client_id)
        chart = connector_for(runtime, request.organization, Bounds.chart(runtime.settings),
                              recorder).fetch_chart(request.patient_id)
        key = chart_key(request_id)
        store = runtime.batch_object_store
        with tempfile.TemporaryDirectory(prefix="svc-chart-") as directory:
            path = write_chart_zip(chart, request_id, zip_password(request.application_id), directory)
            store.put_file(key, path)
        if not store.exists(key):
            raise OSError(f"{key} is not in the object store after its upload")
    if not (ChartRequest.update(status="ready", ready_at=runtime.clock.now(), object_key=key, error=None)
            .where((ChartRequest.id == request_id) & (ChartRequest.status == "pending")).execute()):
        request = ChartRequest.get_or_none(ChartRequest.id == request_id)
        if request is None:
            store.delete(key)  # deleted with its app while it was built: no row to remember the key
        elif request.status != "ready":
            # Failed (the sweep gave up on a stalled build) or expired while it was built: nothing
            # would ever find or expire this ZIP. A `ready` request's object is this same key,
            # published by another delivery: it stays.
            discard_archive(runtime, request_id)
        return request
    return ChartRequest.get_by_id(request_id)


ENDED = ("failed", "expired")
"""The statuses of a request that holds no archive: an `object_key` there is one still to delete."""


def mark_failed(runtime, request_id: str, reason: str) -> None:
    """End a pending request `failed`, then delete any ZIP a build of it stored: one that uploaded
    and then failed (the check of its upload, or `ready`, raised on its last try), or whose worker
    was killed after its upload. Nothing else would ever delete it (expiry deletes `ready` charts'):
    the request keeps the key (`object_key`) until the delete succeeded, so a store down now leaves
    it to the recovery sweep (`workers.recovery.discard_archives`)."""
    key = chart_key(request_id)
    if not (ChartRequest.update(status="failed", error=reason, object_key=key)
            .where((ChartRequest.id == request_id) & (ChartRequest.status == "pending")).execute()):
        return
    _delete_archive(runtime, request_id, key)


def discard_archive(runtime, request_id: str) -> None:
    """Delete the ZIP a build stored for a request that ended without it (`ENDED`), its key kept on
    the request until the delete succeeded (as `mark_failed` keeps it)."""
    key = chart_key(request_id)
    if ChartRequest.update(object_key=key).where((ChartRequest.id == request_id)
                                                 & ChartRequest.status.in_(ENDED)).execute():
        _delete_archive(runtime, request_id, key)


def _delete_archive(runtime, request_id: str, key: str) -> None:
    try:
        runtime.batch_object_store.delete(key)
    except Exception as exc:
        log.warning("chart %s: ended, and the archive a build may have stored could not be deleted now (%s: %s); "
                    "the recovery sweep deletes it", request_id, type(exc).__name__, exc)
        return
    forget_archive(request_id, key)


def forget_archive(request_id: str, key: str) -> None:
    """The ended request's archive `key` is deleted: the request no longer names it."""
    (ChartRequest.update(object_key=None)
     .where((ChartRequest.id == request_id) & ChartRequest.status.in_(ENDED) & (ChartRequest.object_key == key))
     .execute())


@task(queue_name="charts")
def build_chart(runtime, request_id: str) -> None:
    message = CurrentMessage.get_current_message()
    owner = message.message_id if message is not None else None
    try:
        build_chart_archive(runtime, request_id, owner)
    except ConnectorUnavailable as exc:
        if runtime.task_queue.last_attempt():
            request = ChartRequest.get_or_none(ChartRequest.id == request_id)
            attempts = request.attempts if request else 0
            mark_failed(runtime, request_id, f"The EHR did not answer after {attempts} attempts: {exc}")
            return
        hold_for_retry(runtime, extend_chart_lease, request_id, owner)
        raise
    except ConnectorError as exc:
        mark_failed(runtime, request_id, str(exc))
    except Exception:
        log.exception("chart %s: build failed", request_id)
        if runtime.task_queue.last_attempt():
            mark_failed(runtime, request_id, "The chart archive could not be built.")
            return
        hold_for_retry(runtime, extend_chart_lease, request_id, owner)
        raise


def enqueue_chart_build(runtime, request_id: str) -> None:
    """Queue the build of a committed, pending `ChartRequest` (the REST API calls this)."""
    runtime.task_queue.send(build_chart, request_id)


# -- test mode --------------------------------------------------------------------------------

def test_mode_key(password: str) -> str:
    # The password is part of the key so a changed SVC_DEMO_APPLICATION_ID gets a fresh archive.
    digest = hashlib.sha256(password.encode()).hexdigest()[:12]
    return f"charts/test-mode/{digest}/{TEST_REQUEST_ID}.zip"


def test_mode_object(runtime) -> str:
    """The key of the fixed, de-identified test-mode ZIP (password SVC_DEMO_APPLICATION_ID), built once."""
    password = zip_password(runtime.settings.demo_application_id)
    key = test_mode_key(password)
    store = runtime.object_store
    if not store.exists(key):
        connector = SandboxConnector(TEST_ORGANIZATION, "Test Mode Clinic")
        chart = connector.fetch_chart(patient_panel(TEST_ORGANIZATION)[0].id)
        with tempfile.TemporaryDirectory(prefix="svc-chart-") as directory:
            store.put_file(key, write_chart_zip(chart, TEST_REQUEST_ID, password, directory, created=TEST_CREATED))
    return key
