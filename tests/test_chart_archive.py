"""Chart ZIPs through the embedded default: in-process worker thread, local store, signed URLs over HTTP."""
from __future__ import annotations

import time
import urllib.parse

import pytest

import workers.charts as charts
from connectors.sandbox import patient_panel
from models.charts import ChartRequest
from helpers.charts import open_archive


def wait_for_status(request_id: str, timeout: float = 30.0) -> ChartRequest:
    deadline = time.time() + timeout
    while time.time() < deadline:
        request = ChartRequest.get_by_id(request_id)
        if request.status != "pending":
            return request
        time.sleep(0.05)
    raise AssertionError(f"chart request {request_id} still pending after {timeout}s")




def local_path(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return parts.path + "?" + parts.query


async def download(api, path: str):
    """GET a binary body over real HTTP: (status, headers, bytes)."""
    response = await api.http.fetch(api.base_url + path, raise_error=False)
    return response.code, response.headers, response.body


@pytest.mark.gen_test(timeout=60)
async def test_chart_zip_is_built_by_the_in_process_worker_and_downloaded_over_a_signed_url(runtime, world, api):
    patient = patient_panel(world.org.id)[7]
    request = ChartRequest.create(application=world.app.id, organization=world.org.id, patient_id=patient.id)
    charts.enqueue_chart_build(runtime, request.id)
    done = wait_for_status(request.id)
    assert (done.status, done.error, done.attempts) == ("ready", None, 1)
    assert done.ready_at is not None and done.object_key == f"charts/{request.id}.zip"

    url = runtime.object_store.presigned_url(done.object_key, runtime.settings.presigned_url_ttl)
    status, headers, body = await download(api, local_path(url))
    assert status == 200 and headers["Content-Type"] == "application/zip"
    assert f'filename="{request.id}.zip"' in headers["Content-Disposition"]
    text, data = open_archive(body, request.id, world.app.id)
    assert f"{patient.first_name} {patient.last_name}" in text and "Encounters" in text
    assert data["patient"]["id"] == patient.id and data["request_id"] == request.id
    assert len(data["encounters"]) >= 3 and all(e["date"] in text for e in data["encounters"])

    # Re-running the task changes nothing: one object, still ready.
    charts.build_chart_archive(runtime, request.id)
    assert ChartRequest.get_by_id(request.id).attempts == 1


@pytest.mark.gen_test(timeout=30)
async def test_signed_urls_expire_and_cannot_be_forged(runtime, world, api, clock):
    key = charts.test_mode_object(runtime)
    url = local_path(runtime.object_store.presigned_url(key, 60))
    status, _, _ = await api.call("GET", url.replace("signature=", "signature=x"))
    assert status == 403
    other = url.replace("a1b2c3d4e5f6a7b8c9d0.zip", "other.zip")
    status, _, body = await api.call("GET", other)
    assert status == 403 and body["error"] == "invalid_signature"
    status, _, _ = await api.call("GET", url)
    assert status == 200
    clock.advance(61)
    status, _, body = await api.call("GET", url)
    assert status == 403 and body["error"] == "url_expired"
    status, _, body = await api.call("GET", "/objects/../keys/hmac.key?expires=1&signature=x")
    assert status in (403, 404) and "error" in body


@pytest.mark.gen_test(timeout=30)
async def test_a_signature_that_is_not_ascii_is_a_403_not_a_500(runtime, world, api):
    """`hmac.compare_digest` raises TypeError on non-ASCII text: a download URL whose `signature`
    was `é` (or any non-ASCII character, encoded once or twice) answered 500."""
    key = charts.test_mode_object(runtime)
    url = local_path(runtime.object_store.presigned_url(key, 60))
    for junk in ("%C3%A9", "%25C3%25A9", "%E2%80%AE" * 40, "%F0%9F%94%91"):
        forged = url[:url.index("signature=") + len("signature=")] + junk
        status, _, body = await api.call("GET", forged)
        assert status == 403 and body["error"] == "invalid_signature", (junk, body)
    status, _, _ = await api.call("GET", url)
    assert status == 200  # the real signature still works


def test_unknown_patient_fails_with_a_reason(runtime, world):
    request = ChartRequest.create(application=world.app.id, organization=world.org.id, patient_id="pat_nobody")
    charts.enqueue_chart_build(runtime, request.id)
    done = wait_for_status(request.id)
    assert done.status == "failed" and "no patient pat-nobody" in done.error
    assert not runtime.object_store.exists(charts.chart_key(request.id))


@pytest.mark.gen_test(timeout=30)
async def test_test_mode_zip_is_fixed_and_opens_with_the_demo_application_id(runtime, api):
    key = charts.test_mode_object(runtime)
    assert charts.test_mode_object(runtime) == key  # built once
    url = local_path(runtime.object_store.presigned_url(key, 60))
    status, _, body = await download(api, url)
    assert status == 200
    text, data = open_archive(body, charts.TEST_REQUEST_ID, runtime.settings.demo_application_id)
    assert data["request_id"] == charts.TEST_REQUEST_ID and "Patient chart" in text
    # Deterministic: a fresh build (another deployment) has the same content.
    runtime.object_store.delete(key)
    charts.test_mode_object(runtime)
    status, _, again = await download(api, url)
    assert open_archive(again, charts.TEST_REQUEST_ID, runtime.settings.demo_application_id) == (text, data)
