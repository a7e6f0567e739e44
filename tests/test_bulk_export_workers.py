"""Bulk Data exports on real workers (Redis broker, S3 on moto's server): a `svc-auth worker` killed
with SIGKILL mid-type is replaced, the export ends complete, and no manifest lists a truncated file;
an export waiting for its retry after an EHR outage keeps its lease through the backoff; expired
exports and stale uploads are swept (issue 48 item 4)."""
from __future__ import annotations

import collections
import datetime as dt
from contextlib import contextmanager
from urllib.parse import urlsplit

import pytest

from bulk.files import ndjson_line
from bulk.params import ExportParameters
from connectors import ResourceQuery, connector_for
from connectors.sandbox import patient_panel
from helpers.bulk import Backend, schedule_patients
from helpers.processes import free_port, settings_env, start_process, stop_process, wait_until
from helpers.r4 import r4_problems
from helpers.s3 import AWS, HoldingProxy, bucket_keys, set_ehr_url
from models.bulk import BulkExport, BulkExportFile
from workers.export import requeue_stale_exports, run_export, sweep_exports

RECOVERY_SECONDS = 6
BACKOFF_MS = 20_000  # Dramatiq's first retry waits 20-40 s: far beyond the lease (3 s)
TYPES = ("Patient", "Condition", "Encounter", "Observation")
pytestmark = [pytest.mark.slow, pytest.mark.svc_settings(workers=True, task_recovery_seconds=RECOVERY_SECONDS,
                                                         bulk_file_max_bytes=40_000)]


def _expected(runtime, org, patients) -> dict[str, set[str]]:
    """What the export must hold: each type's ids as the FHIR API's own search finds them."""
    connector = connector_for(runtime, org)
    return {kind: {r["id"] for p in patients for r in connector.search_resources(ResourceQuery(kind, patient=p))}
            for kind in TYPES}


def _each_splits_observations(runtime, org, count: int) -> int:
    """The panel offset of `count` patients each of whose Observations alone pass a part's size:
    whatever their order, the export records an Observation part before it searches the last
    one (0.4 s), so the kill has a window. (With the panel's first patients, one run in ~60 had
    every part boundary inside the last patient's answer: a window of milliseconds.)"""
    connector, bound = connector_for(runtime, org), runtime.settings.bulk_file_max_bytes
    big = [sum(len(ndjson_line(r)) for r in connector.search_resources(ResourceQuery("Observation", patient=p.id)))
           > bound for p in patient_panel(org.id)]
    return next(n for n in range(len(big) - count + 1) if all(big[n:n + count]))


def test_a_worker_killed_mid_export_is_replaced_and_no_manifest_lists_a_truncated_file(
        runtime, world, live, start_worker, tmp_path):
    first = _each_splits_observations(runtime, world.org, 3)
    patients = schedule_patients(world.org, world.physician, world.app, 3, first=first)
    expected = _expected(runtime, world.org, patients)
    set_ehr_url(world.org, "https://ehr.example/test?latency=0.4")  # each patient's search of a type: 0.4 s
    client = Backend(runtime, live, world.org).client(world.org.id)  # a key pair's system token
    victim = start_worker()
    status, headers, body = client.kick_off("/Patient/$export", {"_type": ",".join(TYPES)})
    assert status == 202, body
    url = headers["Content-Location"]
    export_id = url.rsplit("/", 1)[1]

    def mid_type():
        """The types before Observation done, and an Observation part recorded that holds one
        patient of the three: two searches (0.4 s each) are left, so the kill lands mid-type. (A
        type's last part is recorded just before the type is marked done: a check that took any
        recorded part of an unfinished type could see that moment, and the kill then landed after it.)"""
        job = BulkExport.get_by_id(export_id)
        if job.status != "pending" or "Observation" in (job.done_types or ()):
            return False
        parts = BulkExportFile.select().where((BulkExportFile.export == export_id)
                                              & (BulkExportFile.resource_type == "Observation"))
        return len({p for part in parts for p in part.patients}) == 1
    wait_until(mid_type, 60, "a type done and the next one half written")
    victim.kill()
    victim.wait()
    killed = BulkExport.get_by_id(export_id)
    assert killed.status == "pending" and len(killed.done_types) < len(TYPES)
    half = [f.resource_type for f in BulkExportFile.select().where(BulkExportFile.export == export_id)
            if f.resource_type not in killed.done_types]
    assert half, "the kill left a type half written"
    assert client.status(url)[0] == 202  # the manifest is not there yet

    start_worker()
    manifest = client.wait(url, timeout=RECOVERY_SECONDS + 60)
    assert BulkExport.get_by_id(export_id).attempts == 2
    found = collections.defaultdict(list)
    for output in manifest["output"]:
        resources = client.download(output["url"])  # whole lines of JSON, as many as the manifest says
        assert len(resources) == output["count"]
        found[output["type"]] += resources
    for kind in TYPES:
        ids = [r["id"] for r in found[kind]]
        assert len(ids) == len(set(ids)) and set(ids) == expected[kind], kind  # nothing twice, nothing missing
    assert len([o for o in manifest["output"] if o["type"] == "Observation"]) > 1  # split in parts
    sample = [r for kind in TYPES for r in found[kind][:20]]
    assert [p for p in r4_problems(sample) if p] == []
    # The bucket holds exactly the listed files: the killed delivery's parts were replaced, not left.
    keys = [k for k in bucket_keys(runtime.settings) if k.startswith(f"bulk/{export_id}/")]
    assert sorted(keys) == sorted(f.object_key for f in BulkExportFile.select().where(BulkExportFile.export == export_id))
    assert len(keys) == len(manifest["output"])


@pytest.mark.svc_settings(workers=True, task_recovery_seconds=RECOVERY_SECONDS, task_min_backoff_ms=BACKOFF_MS)
def test_an_export_waiting_for_its_retry_after_an_ehr_outage_keeps_its_lease_through_the_backoff(
        runtime, world, live, start_worker, tmp_path):
    """Else the sweep re-queued a second delivery beside Dramatiq's retry: each claim counted an
    attempt, and a long outage ended the export as its worker's death (500), not the EHR's (503)."""
    schedule_patients(world.org, world.physician, world.app, 1)
    set_ehr_url(world.org, "https://ehr.example/test?outage=1")
    client = Backend(runtime, live, world.org).client(world.org.id)
    start_worker()
    status, headers, body = client.kick_off("/Patient/$export", {"_type": "Patient"})
    assert status == 202, body
    export_id = headers["Content-Location"].rsplit("/", 1)[1]
    wait_until(lambda: "Retrying message" in (tmp_path / "worker0.log").read_text(), 60,
               "the first try to meet the outage")
    runtime.clock.advance(2 * BACKOFF_MS / 1000)  # the longest the first retry may wait
    assert requeue_stale_exports(runtime) == []
    job = BulkExport.get_by_id(export_id)
    assert (job.status, job.attempts) == ("pending", 1)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_expired_exports_are_deleted_with_their_files(runtime, world):
    patients = schedule_patients(world.org, world.physician, world.app, 2)
    job = BulkExport.create(application=world.app.id, organization=world.org.id, level="patient",
                            request_url="x", transaction_time=runtime.clock.now(),
                            parameters=ExportParameters("patient", ("Patient", "Condition")).as_json())
    run_export(runtime, job.id)
    done = BulkExport.get_by_id(job.id)
    assert done.status == "complete" and done.expires_at > runtime.clock.now()
    files = list(BulkExportFile.select().where(BulkExportFile.export == job.id))
    assert {f.resource_type for f in files} == {"Patient", "Condition"}
    assert set(files[0].patients) <= set(patients)
    assert all(runtime.object_store.exists(f.object_key) for f in files)
    sweep_exports(runtime)
    assert BulkExport.get_or_none(BulkExport.id == job.id) is not None  # not expired yet
    # A part stored but not recorded (its writer killed between the two) goes with the export too.
    runtime.object_store.put_file(f"bulk/{job.id}/Condition-9.ndjson", __file__)
    runtime.clock.advance(runtime.settings.bulk_file_ttl + 1)
    sweep_exports(runtime)
    assert BulkExport.get_or_none(BulkExport.id == job.id) is None
    assert not any(runtime.object_store.exists(f.object_key) for f in files)
    assert [k for k in bucket_keys(runtime.settings) if k.startswith("bulk/")] == []


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_an_expired_export_the_store_will_not_delete_holds_back_no_other(runtime, world, monkeypatch):
    """The expiry sweep stopped at the first export whose files the store refused to delete, so
    with its rows now kept until the files go, every export expiring after it would be kept for
    ever. Each is deleted whatever happened to the others; the stuck one is logged and kept."""
    from workers.export import ExportsKept, delete_expired_exports
    schedule_patients(world.org, world.physician, world.app, 2)
    jobs = []
    for _ in range(2):
        job = BulkExport.create(application=world.app.id, organization=world.org.id, level="patient",
                                request_url="x", transaction_time=runtime.clock.now(),
                                parameters=ExportParameters("patient", ("Patient",)).as_json())
        run_export(runtime, job.id)
        jobs.append(job.id)
        runtime.clock.advance(1)  # the first expires first: the sweep takes it first
    stuck, other = jobs
    store, delete = runtime.object_store, runtime.object_store.delete

    def refusing(key):  # the store refuses this export's objects (a lock, a policy): the others go
        if key.startswith(f"bulk/{stuck}/"):
            raise PermissionError(f"AccessDenied: DeleteObject {key}")
        delete(key)
    monkeypatch.setattr(store, "delete", refusing)
    runtime.clock.advance(runtime.settings.bulk_file_ttl + 1)
    with pytest.raises(ExportsKept, match=stuck):
        delete_expired_exports(runtime)
    assert BulkExport.get_or_none(BulkExport.id == other) is None
    assert not [k for k in bucket_keys(runtime.settings) if k.startswith(f"bulk/{other}/")]
    assert BulkExport.get_or_none(BulkExport.id == stuck) is not None  # its rows still lead to what is left


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_an_export_whose_workers_keep_dying_fails_once_its_tries_are_used_up(runtime, world):
    job = BulkExport.create(application=world.app.id, organization=world.org.id, level="patient", request_url="x",
                            transaction_time=runtime.clock.now(),
                            parameters=ExportParameters("patient", ("Patient",)).as_json(),
                            attempts=runtime.settings.task_max_retries + 1, lease_owner="dead",
                            lease_until=runtime.clock.now() - dt.timedelta(seconds=1))
    assert requeue_stale_exports(runtime) == []
    failed = BulkExport.get_by_id(job.id)
    assert failed.status == "failed" and "its worker stopped" in failed.error


@contextmanager
def serve_behind_holding_s3(runtime, world, settings, tmp_path):
    """A `serve` whose S3 is behind a `HoldingProxy` (1 s a try), the clinic with 2 scheduled
    patients: (the proxy, a backend's Bulk client of the clinic); both stopped after."""
    proxy = HoldingProxy(urlsplit(settings.s3_endpoint_url).port)
    port = free_port()
    issuer = f"http://127.0.0.1:{port}"
    env = settings_env(settings, SVC_ISSUER=issuer, SVC_PUBLIC_URL=issuer, SVC_S3_ENDPOINT_URL=proxy.url,
                       SVC_S3_TIMEOUT=1, **AWS)
    serve = start_process(["serve", "--port", str(port)], env, port, log_path=tmp_path / "serve.log")
    try:
        schedule_patients(world.org, world.physician, world.app, 2)
        yield proxy, Backend(runtime, issuer, world.org).client(world.org.id)
    finally:
        stop_process(serve)
        proxy.close()


def test_a_delete_the_object_store_fails_keeps_the_rows_and_a_retry_removes_files_and_rows(
        runtime, world, settings, tmp_path):
    """`DELETE` of a complete export while S3 answers none of its object DELETEs (`HoldingProxy` holds
    them; `serve` waits 1 s a try, two tries): the rows went first, and the patients' files stayed
    under `bulk/<id>/` with nothing pointing at them. Objects go first now: the DELETE answers 503
    with Retry-After, the export is as it was, and the DELETE sent again once S3 answers removes
    its objects and its rows."""
    with serve_behind_holding_s3(runtime, world, settings, tmp_path) as (proxy, client):
        status, headers, body = client.kick_off("/Patient/$export", {"_type": "Patient,Condition"})
        assert status == 202, body
        url = headers["Content-Location"]
        export_id = url.rsplit("/", 1)[1]
        run_export(runtime, export_id)  # built here: no worker takes its queued message
        manifest = client.wait(url, timeout=30)
        stored = sorted(k for k in bucket_keys(settings) if k.startswith(f"bulk/{export_id}/"))
        assert stored and len(stored) == len(manifest["output"])

        proxy.arm(rb"DELETE /" + settings.s3_bucket.encode() + rb"/bulk/")
        status, headers, body = client.request("DELETE", url)
        assert proxy.held.is_set()
        assert status == 503 and int(headers["Retry-After"]) >= 1, body
        rows = sorted(f.object_key for f in BulkExportFile.select().where(BulkExportFile.export == export_id))
        assert rows == stored  # the rows that find the files are all there
        assert sorted(k for k in bucket_keys(settings) if k.startswith(f"bulk/{export_id}/")) == stored
        assert client.status(url)[0] == 200  # as it was: its manifest, its files downloadable
        assert client.download(manifest["output"][0]["url"])

        proxy.disarm()
        assert client.request("DELETE", url)[0] == 202
        assert BulkExport.get_or_none(BulkExport.id == export_id) is None
        assert not BulkExportFile.select().where(BulkExportFile.export == export_id).exists()
        assert [k for k in bucket_keys(settings) if k.startswith("bulk/")] == []
        assert client.status(url)[0] == 404


def test_a_kick_off_is_not_held_back_by_an_expired_export_the_store_will_not_delete(
        runtime, world, settings, tmp_path):
    """A kick-off first deletes the app's expired exports (`bulk.api.forget_expired`), which it needs
    none of gone. Since an export's rows stay until its objects go, one whose objects S3 does not
    delete (`HoldingProxy` holds its DELETEs: `serve` waits 1 s a try, two tries) made every kick-off
    of the app answer 503 for as long as that lasted. The kick-off goes on (the export is left, rows
    and files, to the sweep), and one sent once S3 answers again deletes it."""
    with serve_behind_holding_s3(runtime, world, settings, tmp_path) as (proxy, client):
        status, headers, body = client.kick_off("/Patient/$export", {"_type": "Patient"})
        assert status == 202, body
        expired = headers["Content-Location"].rsplit("/", 1)[1]
        run_export(runtime, expired)  # built here: no worker takes its queued message
        client.wait(headers["Content-Location"], timeout=30)
        stored = sorted(k for k in bucket_keys(settings) if k.startswith(f"bulk/{expired}/"))
        assert stored
        (BulkExport.update(expires_at=runtime.clock.now() - dt.timedelta(seconds=1))
         .where(BulkExport.id == expired).execute())

        proxy.arm(rb"DELETE /" + settings.s3_bucket.encode() + rb"/bulk/")
        status, headers, body = client.kick_off("/Patient/$export", {"_type": "Patient"})
        assert proxy.held.is_set()
        assert status == 202, (status, body)
        assert BulkExport.get_or_none(BulkExport.id == expired) is not None  # left to the sweep
        assert sorted(k for k in bucket_keys(settings) if k.startswith(f"bulk/{expired}/")) == stored

        proxy.disarm()
        status, headers, body = client.kick_off("/Patient/$export", {"_type": "Patient"})
        assert status == 202, (status, body)
        assert BulkExport.get_or_none(BulkExport.id == expired) is None
        assert not BulkExportFile.select().where(BulkExportFile.export == expired).exists()
        assert not [k for k in bucket_keys(settings) if k.startswith(f"bulk/{expired}/")]
