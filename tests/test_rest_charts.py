"""Chart retrieval over HTTP: request -> worker builds the ZIP -> download URL -> the encrypted archive."""
from __future__ import annotations

import datetime as dt
import io
import json
import time

import pytest
import pyzipper

from connectors.sandbox import patient_panel
from lifecycle.applications import register_application
from models.charts import ChartRequest
from models.disclosures import DisclosureRecord
from helpers.charts import fetch_zip, wait_until_not_pending
from helpers.http import LiveHttp
from helpers.processes import free_port, settings_env, start_process, stop_process
from helpers.rest import partner_headers
from helpers.s3 import AWS, SilentServer
from ratelimit.policy import DEFAULT_LIMITS
from workers.recovery import EXPIRE_BATCH, expire_charts, sweep
from workers.retention import LINKS_KEPT, sweep_retention

TEST_ID = "a1b2c3d4e5f6a7b8c9d0"






@pytest.mark.gen_test(timeout=60)
async def test_chart_request_is_built_and_downloadable_by_its_app_only(api, world, runtime, clock):
    app = world.app
    headers = await partner_headers(api, app, world.secret)
    patient = patient_panel(world.org.id)[0]
    status, _, created = await api.call("POST", "/v1/chart-retrieval/requests", {
        "svc_organization_id": world.org.id, "patient_id": patient.id}, headers=headers)
    assert status == 202 and created["status"] == "pending"
    request_id = created["request_id"]

    done = await wait_until_not_pending(api, headers, request_id)
    assert done["status"] == "ready" and done["ready_at"] and done["error"] is None
    status, resp_headers, body = await api.call("GET", f"/v1/chart-retrieval/download-url/{request_id}",
                                                headers=headers)
    assert status == 200 and resp_headers["RateLimit-Limit"] == str(DEFAULT_LIMITS["chart_download_url"].count)
    response = await fetch_zip(api, body["download_url"], runtime)
    assert response.code == 200
    with pyzipper.AESZipFile(io.BytesIO(response.body)) as archive:
        archive.setpassword(app.id.encode())
        assert sorted(archive.namelist()) == [f"{request_id}.json", f"{request_id}.pdf"]
        assert archive.read(f"{request_id}.pdf").startswith(b"%PDF")
        json.loads(archive.read(f"{request_id}.json"))

    other, secret = register_application(runtime, "Other", "https://o.example/m", "https://o.example/l")
    other_headers = await partner_headers(api, other, secret)
    for path in (f"/v1/chart-retrieval/download-url/{request_id}", f"/v1/chart-retrieval/requests/{request_id}"):
        status, _, body = await api.call("GET", path, headers=other_headers)
        assert status == 404 and body["error"] == "chart_request_not_found"

    clock.advance(runtime.settings.presigned_url_ttl + 1)
    response = await fetch_zip(api, body_url := (await api.call(
        "GET", f"/v1/chart-retrieval/download-url/{request_id}",
        headers=await partner_headers(api, app, world.secret)))[2]["download_url"], runtime)
    assert response.code == 200 and body_url  # a fresh URL works after the old one expired


async def ready_chart(api, world) -> tuple[dict, str]:
    """The partner's headers and the id of a chart request of the clinic's first patient, built."""
    headers = await partner_headers(api, world.app, world.secret)
    status, _, created = await api.call("POST", "/v1/chart-retrieval/requests", {
        "svc_organization_id": world.org.id, "patient_id": patient_panel(world.org.id)[0].id}, headers=headers)
    assert status == 202, created
    assert (await wait_until_not_pending(api, headers, created["request_id"]))["status"] == "ready"
    return headers, created["request_id"]


@pytest.mark.gen_test(timeout=60)
async def test_a_chart_s_archive_is_deleted_svc_chart_ttl_after_it_was_built(api, world, runtime, clock):
    """A patient's chart ZIP stayed in the object store for ever. The workers' sweep deletes it
    SVC_CHART_TTL after it was built: the request reads `expired`, a download URL is 410
    `chart_expired`, and a URL handed out before no longer downloads anything."""
    headers, request_id = await ready_chart(api, world)
    key = ChartRequest.get_by_id(request_id).object_key
    runtime.batch_object_store.open_object(key)[0].close()  # it is there
    clock.advance(runtime.settings.chart_ttl - 60)
    sweep(runtime)  # what every worker's recovery loop runs
    headers = await partner_headers(api, world.app, world.secret)  # the partner's token of a week ago expired
    status, _, body = await api.call("GET", f"/v1/chart-retrieval/download-url/{request_id}", headers=headers)
    assert status == 200  # a minute before its time: kept
    early_url = body["download_url"]

    clock.advance(61)
    sweep(runtime)
    with pytest.raises(FileNotFoundError):
        runtime.batch_object_store.open_object(key)
    status, _, body = await api.call("GET", f"/v1/chart-retrieval/requests/{request_id}", headers=headers)
    assert status == 200 and body["status"] == "expired" and "SVC_CHART_TTL" in body["error"], body
    status, _, body = await api.call("GET", f"/v1/chart-retrieval/download-url/{request_id}", headers=headers)
    assert status == 410 and body["error"] == "chart_expired" and "request the chart again" in body["message"], body
    assert (await fetch_zip(api, early_url, runtime)).code == 404
    sweep(runtime)  # nothing left to do, nothing changes
    assert ChartRequest.get_by_id(request_id).status == "expired"


@pytest.mark.gen_test(timeout=60)
async def test_a_store_that_refuses_its_upload_listing_still_has_its_charts_expired(
        api, world, runtime, clock, monkeypatch, caplog):
    """S3 credentials without s3:ListBucketMultipartUploads made every sweep stop at its uploads
    step, so expiry (the steps after it) never ran: a patient's chart was kept for ever. Each step
    now runs whatever the others did; the round still counts as failed, and says which step."""
    from workers.loops import StepsFailed
    _, request_id = await ready_chart(api, world)
    key = ChartRequest.get_by_id(request_id).object_key

    def refused(prefix):
        raise PermissionError("AccessDenied: s3:ListBucketMultipartUploads")
    monkeypatch.setattr(runtime.batch_object_store, "unfinished_uploads", refused)
    clock.advance(runtime.settings.chart_ttl + 60)
    with pytest.raises(StepsFailed, match="2 of 7 steps failed: sweep_uploads, sweep_exports"):
        sweep(runtime)
    assert ChartRequest.get_by_id(request_id).status == "expired"
    with pytest.raises(FileNotFoundError):
        runtime.batch_object_store.open_object(key)
    assert any("sweep_uploads failed" in r.getMessage() and r.exc_info for r in caplog.records)


@pytest.mark.gen_test(timeout=60)
async def test_an_ended_chart_request_is_forgotten_links_kept_after_it_ended(api, world, runtime, clock):
    """Chart requests were never deleted. Retention deletes one `expired` more than LINKS_KEPT ago,
    or `failed` more than LINKS_KEPT ago; until then the partner API still says which, then 404.
    A ready one is left to the recovery sweep (its archive goes first)."""
    headers, request_id = await ready_chart(api, world)
    ChartRequest.create(id="chr_failed", application=world.app.id, organization=world.org.id, patient_id="p1",
                        status="failed", error="The chart build could not be queued.", created_at=clock.now())
    clock.advance(runtime.settings.chart_ttl + 60)
    sweep(runtime)
    ChartRequest.create(id="chr_ready", application=world.app.id, organization=world.org.id, patient_id="p1",
                        status="ready", ready_at=clock.now(), object_key="charts/chr_ready.zip")
    clock.advance(LINKS_KEPT.total_seconds() - runtime.settings.chart_ttl)
    assert sweep_retention(runtime)["chart_requests"] == 1  # the failed one, ended LINKS_KEPT and a minute ago
    headers = await partner_headers(api, world.app, world.secret)
    status, _, body = await api.call("GET", f"/v1/chart-retrieval/requests/{request_id}", headers=headers)
    assert status == 200 and body["status"] == "expired", body  # expired less than LINKS_KEPT ago: kept
    assert (await api.call("GET", "/v1/chart-retrieval/requests/chr_failed", headers=headers))[0] == 404

    clock.advance(runtime.settings.chart_ttl)
    assert sweep_retention(runtime)["chart_requests"] == 1  # expired LINKS_KEPT and a minute ago
    headers = await partner_headers(api, world.app, world.secret)
    status, _, body = await api.call("GET", f"/v1/chart-retrieval/requests/{request_id}", headers=headers)
    assert status == 404, body
    assert ChartRequest.get_by_id("chr_ready").status == "ready"  # not retention's to delete


@pytest.mark.gen_test(timeout=60)
async def test_deleting_an_app_deletes_its_charts_zips(api, world, runtime, cli):
    """`apps delete` cascaded to the app's chart requests but left their ZIPs in the object store for
    ever (the expiry sweep finds them through those rows), and a URL handed out before still
    downloaded. The ZIPs go first now."""
    headers, request_id = await ready_chart(api, world)
    key = ChartRequest.get_by_id(request_id).object_key
    status, _, body = await api.call("GET", f"/v1/chart-retrieval/download-url/{request_id}", headers=headers)
    assert status == 200 and (await fetch_zip(api, body["download_url"], runtime)).code == 200
    cli("apps", "delete", "--app", world.app.id, "--yes")
    with pytest.raises(FileNotFoundError):
        runtime.batch_object_store.open_object(key)
    assert (await fetch_zip(api, body["download_url"], runtime)).code == 404
    assert ChartRequest.get_or_none(ChartRequest.id == request_id) is None


def test_a_chart_built_while_its_app_was_deleted_leaves_no_zip(world, runtime, monkeypatch):
    """The app is deleted (its request with it) while its chart is uploaded: the build finds no
    request to mark ready, and deletes the ZIP nothing would ever find."""
    from lifecycle.applications import delete_application
    from workers.charts import build_chart_archive, chart_key
    request = ChartRequest.create(application=world.app.id, organization=world.org.id,
                                  patient_id=patient_panel(world.org.id)[0].id)
    store = runtime.batch_object_store
    real_put = store.put_file

    def put_then_app_deleted(key, path):
        real_put(key, path)
        delete_application(runtime, world.app.id)
    monkeypatch.setattr(store, "put_file", put_then_app_deleted)
    assert build_chart_archive(runtime, request.id) is None
    assert not store.exists(chart_key(request.id))


def test_a_stalled_build_whose_request_failed_meanwhile_leaves_no_zip(world, runtime):
    """A build on its last try stalls past its lease (a slow EHR, a database blip for its lease
    keeper): the sweep fails the request (its tries are used up) and the partner reads 409. The
    stalled build then went on to upload its ZIP, found the request no longer pending and left the
    ZIP in the store: a patient's chart kept for ever (expiry only deletes `ready` charts' ZIPs)."""
    from workers.charts import build_chart_archive, chart_key
    from workers.leases import lease_seconds
    from workers.recovery import sweep_charts
    request = ChartRequest.create(application=world.app.id, organization=world.org.id,
                                  patient_id=patient_panel(world.org.id)[0].id,
                                  attempts=runtime.settings.task_max_retries)
    store = runtime.batch_object_store
    real_put = store.put_file

    def put_after_the_sweep_gave_up(key, path):
        runtime.clock.advance(lease_seconds(runtime.settings) + 1)  # the lease lapsed
        assert sweep_charts(runtime) == []  # no tries left: failed, not re-queued
        assert ChartRequest.get_by_id(request.id).status == "failed"
        real_put(key, path)
    store.put_file = put_after_the_sweep_gave_up
    try:
        build_chart_archive(runtime, request.id)
    finally:
        store.put_file = real_put
    assert ChartRequest.get_by_id(request.id).status == "failed"
    assert not store.exists(chart_key(request.id))


@pytest.mark.svc_settings(task_max_retries=0)
@pytest.mark.gen_test(timeout=60)
async def test_a_build_that_fails_after_its_upload_leaves_no_zip_of_its_failed_request(api, world, runtime,
                                                                                       monkeypatch):
    """The ZIP is uploaded, then the build fails on its last try (the store's check of the upload,
    or the database's `ready`, fails: S3 or PostgreSQL blipped). The request ended `failed` (409)
    and the ZIP stayed in the store for ever: expiry only deletes `ready` charts' ZIPs."""
    from workers.charts import chart_key
    store = runtime.batch_object_store

    def check_fails(key):
        raise OSError("HeadObject: 503 SlowDown")
    monkeypatch.setattr(store, "exists", check_fails)
    headers = await partner_headers(api, world.app, world.secret)
    status, _, created = await api.call("POST", "/v1/chart-retrieval/requests", {
        "svc_organization_id": world.org.id, "patient_id": patient_panel(world.org.id)[0].id}, headers=headers)
    assert status == 202, created
    done = await wait_until_not_pending(api, headers, created["request_id"])
    assert done["status"] == "failed", done
    status, _, body = await api.call("GET", f"/v1/chart-retrieval/download-url/{created['request_id']}",
                                     headers=headers)
    assert status == 409 and body["error"] == "chart_failed", body
    monkeypatch.undo()
    assert not store.exists(chart_key(created["request_id"]))


def test_a_backlog_of_old_charts_expires_a_batch_per_sweep_oldest_first(world, runtime):
    """The first sweep after an upgrade finds every chart ever built: it deletes EXPIRE_BATCH of
    them, the oldest, and the next sweep the rest; a chart still within SVC_CHART_TTL stays."""
    now = runtime.clock.now()
    old = [now - dt.timedelta(seconds=runtime.settings.chart_ttl + 3600 * (n + 1)) for n in range(EXPIRE_BATCH + 1)]
    ChartRequest.insert_many([{"id": f"chr_old{n:04d}", "application": world.app.id, "organization": world.org.id,
                               "patient_id": "p1", "status": "ready", "ready_at": at, "created_at": at,
                               "object_key": f"charts/chr_old{n:04d}.zip"} for n, at in enumerate(old)]).execute()
    ChartRequest.create(id="chr_recent", application=world.app.id, organization=world.org.id, patient_id="p1",
                        status="ready", ready_at=now, object_key="charts/chr_recent.zip")
    first = expire_charts(runtime)
    assert len(first) == EXPIRE_BATCH and f"chr_old{EXPIRE_BATCH:04d}" in first and "chr_old0000" not in first
    assert expire_charts(runtime) == ["chr_old0000"] and expire_charts(runtime) == []
    assert ChartRequest.get_by_id("chr_recent").status == "ready"


@pytest.mark.gen_test
async def test_pending_is_202_with_retry_after_and_failed_is_409(api, world, runtime):
    app = world.app
    headers = await partner_headers(api, app, world.secret)
    pending = ChartRequest.create(application=app.id, organization=world.org.id, patient_id="p1")
    status, resp_headers, body = await api.call("GET", f"/v1/chart-retrieval/download-url/{pending.id}",
                                                headers=headers)
    assert status == 202 and int(resp_headers["Retry-After"]) > 0 and body["status"] == "pending"
    failed = ChartRequest.create(application=app.id, organization=world.org.id, patient_id="p2",
                                 status="failed", error="Patient not found.")
    status, _, body = await api.call("GET", f"/v1/chart-retrieval/download-url/{failed.id}", headers=headers)
    assert status == 409 and body["error"] == "chart_failed" and "Patient not found" in body["message"]
    status, _, body = await api.call("GET", f"/v1/chart-retrieval/requests/{failed.id}", headers=headers)
    assert body["status"] == "failed" and body["error"] == "Patient not found."


@pytest.mark.gen_test
async def test_chart_request_bad_input(api, world, runtime):
    headers = await partner_headers(api, world.app, world.secret)
    cases = [({"svc_organization_id": world.org.id}, 400), ({"svc_organization_id": 1, "patient_id": "p"}, 400),
             ({"svc_organization_id": world.org.id, "patient_id": "p", "x": 1}, 400),
             ({"svc_organization_id": "../etc", "patient_id": "p"}, 400),
             ({"svc_organization_id": "org_unknown", "patient_id": "p"}, 404)]
    for body, expected in cases:
        status, _, answer = await api.call("POST", "/v1/chart-retrieval/requests", body, headers=headers)
        assert status == expected, (body, answer)
    status, _, _ = await api.call("GET", "/v1/chart-retrieval/download-url/not%20an%20id", headers=headers)
    assert status == 400
    status, _, _ = await api.call("GET", "/v1/chart-retrieval/download-url/ffffffffffffffffffff", headers=headers)
    assert status == 404
    for junk in ("%00", "a%00b", "x" * 300):  # NUL reaches no query (PostgreSQL refuses it in text: a 500 once)
        status, _, answer = await api.call("GET", f"/v1/chart-retrieval/download-url/{junk}", headers=headers)
        assert status == 400, (junk, answer)
    assert ChartRequest.select().count() == 0


@pytest.mark.gen_test
async def test_a_chart_request_naming_no_id_is_a_recorded_400_on_both_databases(api, world, runtime):
    """The body's `svc_organization_id` went into the failure's disclosure record as it came: on
    PostgreSQL one over 64 characters overflowed the column, and the caller got 503
    `audit_unavailable` (bad input, retried for ever) instead of 400; its `patient_id` was recorded too."""
    headers = await partner_headers(api, world.app, world.secret)
    before = DisclosureRecord.select().count()
    for body in ({"svc_organization_id": "o" * 65, "patient_id": "pat-1"},
                 {"svc_organization_id": "o" * 5000, "patient_id": "p" * 5000},
                 {"svc_organization_id": world.org.id, "patient_id": "p" * 65},
                 {"svc_organization_id": world.org.id + "/..", "patient_id": "pat 1"}):
        status, _, answer = await api.call("POST", "/v1/chart-retrieval/requests", body, headers=headers)
        assert status == 400 and answer["error"] == "invalid_path_parameter", (status, answer)
    records = list(DisclosureRecord.select().where(DisclosureRecord.seq > before).order_by(DisclosureRecord.seq))
    assert [(r.action, r.outcome, r.status) for r in records] == [("chart.request", "failure", 400)] * 4
    assert [r.organization_id for r in records] == [None, None, world.org.id, None]
    assert all(r.patients in ([], ["pat-1"]) for r in records), [r.patients for r in records]
    assert ChartRequest.select().count() == 0


@pytest.fixture
def unreachable_s3(monkeypatch):
    """Credentials for an S3 store configured on a loopback port nothing listens on."""
    for name, value in AWS.items():
        monkeypatch.setenv(name, value)


@pytest.mark.svc_settings(s3_bucket="charts-unreachable", s3_endpoint_url=f"http://127.0.0.1:{free_port()}")
@pytest.mark.gen_test(timeout=90)
async def test_an_unreachable_object_store_is_503_with_retry_after(api, world, runtime, unreachable_s3):
    """The test-mode ZIP is built into the store on first use: with S3 unreachable botocore's
    EndpointConnectionError reached Tornado and the partner got a 500 (a down dependency is a 503)."""
    headers = await partner_headers(api, world.app, world.secret)
    status, response_headers, body = await api.call("GET", f"/v1/chart-retrieval/download-url/{TEST_ID}",
                                                     headers=headers)
    assert status == 503 and int(response_headers["Retry-After"]) > 0, (status, body)
    assert body["error"] == "temporarily_unavailable" and "object store" in body["message"]
    assert not DisclosureRecord.select().where(DisclosureRecord.outcome == "success").exists()  # nothing went out


def test_a_silent_object_store_is_503_with_retry_after_within_seconds(world, settings, tmp_path):
    """An S3 endpoint that accepts connections and never answers: botocore's default 60 s read
    timeout times its retries held the request (and a pool thread) for minutes. The test-mode ZIP is
    built into the store on first use; a `serve` process on that endpoint answers 503 + Retry-After
    within SVC_S3_TIMEOUT (5 s) times two tries."""
    silent = SilentServer()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = settings_env(settings, SVC_ISSUER=base, SVC_PUBLIC_URL=base, SVC_S3_BUCKET="charts-silent",
                       SVC_S3_ENDPOINT_URL=silent.url, **AWS)
    proc = start_process(["serve", "--port", str(port)], env, port, log_path=tmp_path / "serve.log")
    try:
        http = LiveHttp(base)
        status, _, token = http.call("POST", "/v1/oauth/token", {
            "grant_type": "client_credentials", "client_id": world.app.client_id, "client_secret": world.secret})
        assert status == 200, token
        started = time.monotonic()
        status, headers, body = http.call("GET", f"/v1/chart-retrieval/download-url/{TEST_ID}",
                                          headers={"Authorization": f"Bearer {token['access_token']}"})
        waited = time.monotonic() - started
    finally:
        stop_process(proc)
        silent.close()
    assert status == 503 and int(headers["Retry-After"]) > 0, (status, body)
    assert body["error"] == "temporarily_unavailable" and "object store" in body["message"]
    assert waited < 20, waited


@pytest.mark.gen_test(timeout=60)
async def test_test_mode_chart_zip(api, world, runtime):
    status, _, _ = await api.call("GET", f"/v1/chart-retrieval/download-url/{TEST_ID}")
    assert status == 401
    headers = await partner_headers(api, world.app, world.secret)
    status, _, body = await api.call("GET", f"/v1/chart-retrieval/download-url/{TEST_ID}", headers=headers)
    assert status == 200
    response = await fetch_zip(api, body["download_url"], runtime)
    assert response.code == 200
    with pyzipper.AESZipFile(io.BytesIO(response.body)) as archive:
        assert all(info.compress_type == pyzipper.zipfile_aes.WZ_AES or info.flag_bits & 0x1
                   for info in archive.infolist())
        archive.setpassword(runtime.settings.demo_application_id.encode())
        assert sorted(archive.namelist()) == [f"{TEST_ID}.json", f"{TEST_ID}.pdf"]
        assert archive.read(f"{TEST_ID}.pdf").startswith(b"%PDF")
    status, _, body = await api.call("GET", f"/v1/chart-retrieval/requests/{TEST_ID}", headers=headers)
    assert status == 200 and body["status"] == "ready"
