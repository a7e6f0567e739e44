"""Chart retrieval: create a request, read its status, get a 15-minute download URL of its ZIP.

The worker side (`workers.charts`) builds the AES-256 ZIP and stores it in `runtime.object_store`;
here are the partner-facing rules: a request belongs to the app that made it (others get 404),
a pending request answers 202 + `Retry-After`, a failed one 409, an expired one (its archive deleted
SVC_CHART_TTL after it was built: `workers.recovery.expire_charts`) 410, and the test id
`a1b2c3d4e5f6a7b8c9d0` always answers the fixed de-identified ZIP (password SVC_DEMO_APPLICATION_ID).
"""
from __future__ import annotations

import datetime as dt
import logging

from models.application import Application
from models.charts import ChartRequest
from models.clock import utc_iso
from models.ids import fhir_id
from errors import ApiError
from lifecycle.activation import USE
from partner_api.access import installation_of, path_id
from workers.charts import TEST_CREATED, TEST_REQUEST_ID, enqueue_chart_build, test_mode_object

log = logging.getLogger("svc_auth.charts")

PENDING_RETRY_AFTER = 5
"""Seconds a client should wait before asking again about a pending chart."""

CREATE_FIELDS = ("svc_organization_id", "patient_id")
"""In the documented order: the first bad one is named, the same in every process."""


def create_request(runtime, app: Application, body: dict) -> dict:
    unknown = sorted(set(body).difference(CREATE_FIELDS))
    if unknown:
        raise ApiError(400, "unknown_field", f"Unknown field(s): {', '.join(unknown)}.")
    for name in CREATE_FIELDS:
        if not isinstance(body.get(name), str):
            raise ApiError(400, "invalid_request", f"{name} is required and must be a string.")
    organization_id = path_id("svc_organization_id", body["svc_organization_id"])
    patient_id = fhir_id(path_id("patient_id", body["patient_id"]))  # `pat_…` (before issue 35) is `pat-…`
    installation_of(app, organization_id, "svc_organization_id", USE)
    request = ChartRequest.create(application=app.id, organization=organization_id, patient_id=patient_id,
                                 created_at=runtime.clock.now())
    try:
        enqueue_chart_build(runtime, request.id)
    except Exception:
        log.exception("chart %s: could not be queued", request.id)
        (ChartRequest.update(status="failed", error="The chart build could not be queued.")
         .where(ChartRequest.id == request.id).execute())
        raise ApiError(503, "queue_unavailable", "The chart build queue cannot be reached; retry shortly.",
                       {"Retry-After": str(PENDING_RETRY_AFTER)}) from None
    return {"request_id": request.id, "status": "pending"}


def _test_request_status() -> dict:
    return {"request_id": TEST_REQUEST_ID, "status": "ready", "created_at": utc_iso(TEST_CREATED),
            "ready_at": utc_iso(TEST_CREATED), "error": None}


def _own_request(app: Application, request_id: str) -> ChartRequest:
    path_id("requestId", request_id)
    request = ChartRequest.get_or_none((ChartRequest.id == request_id) & (ChartRequest.application == app.id))
    if request is None:
        # Another app's request is indistinguishable from a missing one.
        raise ApiError(404, "chart_request_not_found", f"No chart retrieval request {request_id!r} of this application.")
    return request


def request_status(app: Application, request_id: str) -> dict:
    if request_id == TEST_REQUEST_ID:
        return _test_request_status()
    request = _own_request(app, request_id)
    return {"request_id": request.id, "status": request.status, "created_at": utc_iso(request.created_at),
            "ready_at": utc_iso(request.ready_at), "error": request.error}


def download_target(app: Application, request_id: str) -> tuple[str | None, dict | None]:
    """(object key, None) when the chart is ready, (None, status body) while it is pending;
    409 when the build failed. Database reads: handlers await it on the runtime pool."""
    if request_id == TEST_REQUEST_ID:
        return None, None
    request = _own_request(app, request_id)
    installation_of(app, request.organization_id, "svc_organization_id", USE)  # a Disabled app gets no chart
    if request.status == "pending":
        return None, request_status(app, request_id)
    if request.status == "expired":
        raise ApiError(410, "chart_expired", request.error or "The chart's archive was deleted; request the chart again.")
    if request.status == "failed" or not request.object_key:
        raise ApiError(409, "chart_failed", f"The chart could not be built: {request.error or 'unknown error'}")
    return request.object_key, None


def signed_download(runtime, key: str | None) -> dict:
    """The download URL body for `key` (None: the test-mode ZIP, built on first use). May block:
    building the test ZIP, S3 presigning; the handler runs it off the IOLoop."""
    key = key or test_mode_object(runtime)
    ttl = runtime.settings.presigned_url_ttl
    url = runtime.object_store.presigned_url(key, ttl)
    return {"download_url": url, "expires_at": utc_iso(runtime.clock.now() + dt.timedelta(seconds=ttl))}


def download_url(runtime, app: Application, request_id: str) -> tuple[bool, dict]:
    """(pending?, body): the request's status while it is pending, else its signed download URL."""
    key, pending = download_target(app, request_id)
    if pending is not None:
        return True, pending
    return False, signed_download(runtime, key)
