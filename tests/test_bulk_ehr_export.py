"""A FHIR clinic's Bulk Data export read from its EHR's own `$export` (issue 48 item 3, last point):
real `svc-auth serve` and `svc-auth worker` processes (Redis, S3 on moto's server), the test EHR
(tests/js/fhir_ehr.mjs on Medplum's engine, its Bulk Data switch in tests/js/bulk_export.mjs), on
both databases. The EHR's request log says which path the export took."""
from __future__ import annotations

import collections
import datetime as dt
import json

import pytest

from helpers.bulk import BulkClient, sync_window_closed_now
from helpers.fhir_ehr import appointment, chart_record, cli, connect_clinic, patient, practitioner
from helpers.hostile_ehr import NPI as HOSTILE_NPI
from helpers.processes import wait_until
from helpers.r4 import r4_problems
from helpers.s3 import bucket_keys
from helpers.tokens import mint_platform_token
from lifecycle.applications import install_application
from lifecycle.users import create_user
from models.application import Authorization
from models.appointments import Snapshot, SnapshotAppointment
from models.bulk import BulkExport, BulkExportFile
from models.disclosures import DisclosureRecord

RECOVERY_SECONDS = 6
PATIENT_SEARCHES = ("Patient", "Observation", "Encounter", "Condition")
pytestmark = [pytest.mark.slow, pytest.mark.svc_settings(workers=True, task_recovery_seconds=RECOVERY_SECONDS,
                                                         bulk_file_max_bytes=4000)]


def _clinic(runtime, world, live, ehr, observations: int = 3, more: int = 0) -> BulkClient:
    """A FHIR clinic on the test EHR: pt-x and pt-y (and `more` patients pt-000...) on its physician's
    schedule, pt-z in the EHR but not the clinic's, an Observation of another server's patient; a
    token of its installed app."""
    extra = [f"pt-{n:03d}" for n in range(more)]
    org_id = connect_clinic(runtime.settings, ehr, f"{live}/ehr/jwks.json", name="Bulk EHR Clinic")
    monday = dt.datetime(2026, 3, 2, 9, 0)
    ehr.seed(practitioner("pr-bulk", "1417000043", "Lopez", "Ana"),
             patient("pt-x", "Doe", "Jane", "1970-01-02", "female"), patient("pt-y", "Roe", "Rick", "1955-06-30", "male"),
             patient("pt-z", "Poe", "Zed", "1960-01-01", "male"),
             appointment("bulk-1", "pr-bulk", "pt-x", monday),
             *chart_record("pt-x", encounters=2, observations=observations),
             {"resourceType": "Observation", "id": "obs-y", "status": "final", "code": {"text": "Weight"},
              "subject": {"reference": "Patient/pt-y"}, "valueQuantity": {"value": 70, "unit": "kg"}},
             {"resourceType": "Observation", "id": "obs-z", "status": "final", "code": {"text": "Weight"},
              "subject": {"reference": "Patient/pt-z"}, "valueQuantity": {"value": 80, "unit": "kg"}},
             {"resourceType": "Encounter", "id": "enc-z", "status": "finished", "class": {"code": "AMB"},
              "subject": {"reference": "Patient/pt-z"}},
             {"resourceType": "Observation", "id": "obs-foreign", "status": "final", "code": {"text": "Weight"},
              "subject": {"reference": "https://other-ehr.example/fhir/R4/Patient/pt-x"}},
             *(patient(p, "Many", f"P{n}", "1980-01-01", "female") for n, p in enumerate(extra)))
    install_application(world.app.id, org_id)
    ana = create_user(org_id, "ana@bulk.example", "Ana", "Lopez", "alopez", "1417000043")
    Authorization.create(application=world.app.id, user=ana.id)
    snapshot = Snapshot.create(organization=org_id, snapshot_date=dt.date.today(), status="complete",
                               completed_at=dt.datetime.utcnow())
    for n, pid in enumerate(("pt-x", "pt-y", *extra)):  # pt-z is on nobody's schedule: never exported
        SnapshotAppointment.create(snapshot=snapshot, ehr_appointment_id=f"a{n}", provider=ana.id, provider_npi=ana.npi,
                                   provider_name="Ana", start=monday, end=monday, status="booked", appointment_type="x",
                                   patient_id=pid, patient_first_name="P", patient_last_name="Q",
                                   patient_date_of_birth=dt.date(1970, 1, 1), patient_sex="female")
    return BulkClient(f"{live}/fhir/r4/{org_id}", mint_platform_token(runtime, live, ana, world.app, org_id))


def _searches(ehr) -> dict:
    """The EHR's search pages served so far, by type (its per-patient path)."""
    return {k: v for k, v in ehr.stats()["pages"].items() if k in PATIENT_SEARCHES}


def _export(client, params=None) -> tuple[str, dict, dict[str, list[dict]]]:
    status, headers, body = client.kick_off("/Patient/$export", params or {"_type": "Patient,Observation,Encounter"})
    assert status == 202, body
    url = headers["Content-Location"]
    manifest = client.wait(url, timeout=90)
    files = collections.defaultdict(list)
    for output in manifest["output"]:
        found = client.download(output["url"])
        assert len(found) == output["count"]
        files[output["type"]] += found
    return url, manifest, files


def _valid(files) -> None:
    everything = [r for found in files.values() for r in found]
    bad = [(r["resourceType"], r["id"], p) for r, p in zip(everything, r4_problems(everything)) if p]
    assert bad == [], bad[:3]


def _only_the_clinics(files) -> None:
    assert sorted(p["id"] for p in files["Patient"]) == ["pt-x", "pt-y"]
    observations = {o["id"] for o in files["Observation"]}
    assert "obs-y" in observations and "obs-bp" in observations
    assert not observations & {"obs-z", "obs-foreign", "obs-other"}
    assert {e["id"] for e in files["Encounter"]} == {"enc-000", "enc-001"}
    assert {o["subject"]["reference"] for o in files["Observation"]} == {"Patient/pt-x", "Patient/pt-y"}
    text = json.dumps(files)
    assert "pt-z" not in text and "someone-else" not in text and "other-ehr.example" not in text


def test_an_ehr_offering_export_is_read_through_it_with_only_the_clinics_patients(
        runtime, world, live, fhir_ehr, start_worker):
    client = _clinic(runtime, world, live, fhir_ehr)
    fhir_ehr.bulk(export=True, polls=2, retry_after=1)
    start_worker()
    before = _searches(fhir_ehr)
    url, manifest, files = _export(client)
    log = [(c["method"], c["path"].split("/")[1]) for c in fhir_ehr.bulk()["log"]]
    assert log.count(("POST", "Patient")) == 1 and log.count(("GET", "$export-status")) == 3
    assert log.count(("GET", "$export-file")) == 3 and log[-1] == ("DELETE", "$export-status")  # cleaned up at the EHR
    assert _searches(fhir_ehr) == before  # no per-patient search at all
    assert [o["type"] for o in manifest["output"]] == ["Patient", "Encounter", "Observation"]
    _only_the_clinics(files)
    _valid(files)
    # The FHIR API's own search of each patient finds exactly what the EHR's export gave.
    from helpers.fhir_api import Fhir, resources
    fhir = Fhir(client.base.rsplit("/fhir/r4/", 1)[0], client.base.rsplit("/", 1)[1], client.token)
    for kind in ("Observation", "Encounter"):
        searched = [r for p in ("pt-x", "pt-y") for r in resources(fhir.search(kind, {"patient": p, "_count": 100}))]
        assert sorted(r["id"] for r in files[kind]) == sorted(r["id"] for r in searched), kind
    # Each download names the patients of its file.
    downloads = list(DisclosureRecord.select().where(DisclosureRecord.action == "bulk.download"))
    assert len(downloads) == len(manifest["output"]) and {p for r in downloads for p in r.patients} == {"pt-x", "pt-y"}

    # An EHR that ignores `patient` (exports all it holds): svc-auth keeps only the clinic's patients'
    # lines; `_typeFilter` and `_elements` apply as on the per-patient path.
    fhir_ehr.bulk(patient="ignore", polls=0)
    before = _searches(fhir_ehr)  # (the FHIR API's searches above were the EHR's)
    _, manifest, files = _export(client, {"_type": "Patient,Observation,Encounter", "_elements": "status",
                                          "_typeFilter": "Observation?category=laboratory"})
    assert sorted(p["id"] for p in files["Patient"]) == ["pt-x", "pt-y"]
    assert [o["id"] for o in files["Observation"]] == ["obs-a1c"]
    assert {e["id"] for e in files["Encounter"]} == {"enc-000", "enc-001"}
    assert all(set(r) <= {"resourceType", "id", "meta", "status"} and r["meta"]["tag"][-1]["code"] == "SUBSETTED"
               for found in files.values() for r in found)
    assert "pt-z" not in json.dumps(files)
    assert _searches(fhir_ehr) == before
    # DELETE of the export DELETEs nothing more at the EHR (its job was deleted when done), and is 202.
    assert client.request("DELETE", url)[0] == 202


def test_an_ehr_without_export_is_read_per_patient(runtime, world, live, fhir_ehr, start_worker):
    client = _clinic(runtime, world, live, fhir_ehr)
    start_worker()
    before = _searches(fhir_ehr)
    _, _, files = _export(client)
    assert fhir_ehr.bulk()["log"] == []  # never asked: its CapabilityStatement offers no export
    after = _searches(fhir_ehr)
    assert all(after.get(kind, 0) > before.get(kind, 0) for kind in ("Observation", "Encounter"))
    _only_the_clinics(files)


@pytest.mark.parametrize("failure", [{"patient": "refuse"}, {"fail": "status"}, {"fail": "manifest-error"}])
def test_a_failing_ehr_export_falls_back_to_the_per_patient_path(runtime, world, live, fhir_ehr, start_worker, failure):
    client = _clinic(runtime, world, live, fhir_ehr)
    fhir_ehr.bulk(export=True, polls=0, **failure)
    start_worker()
    before = _searches(fhir_ehr)
    url, _, files = _export(client)
    log = [(c["method"], c["path"].split("/")[1]) for c in fhir_ehr.bulk()["log"]]
    assert log[0] == ("POST", "Patient") and ("GET", "$export-file") not in log
    if "fail" in failure:
        assert log[-1] == ("DELETE", "$export-status")  # the EHR's failed job is cleaned up
    assert _searches(fhir_ehr)["Observation"] > before.get("Observation", 0)  # read per patient instead
    _only_the_clinics(files)
    job = BulkExport.get_by_id(url.rsplit("/", 1)[1])
    assert "fallback" in job.ehr_export


def test_an_ehr_that_forgets_every_export_is_kicked_off_at_most_twice_then_read_per_patient(
        runtime, world, live, hostile, start_worker):
    """The hostile EHR (`export-forgotten`) answers 202 to each kick-off and 404 to every poll: the
    build kicked off anew at once, for ever. It now kicks off once more, a poll interval later, then
    falls back to the per-patient reads; each EHR job it started is DELETEd."""
    hostile.calm()
    hostile.attack("export-forgotten", on="$export")
    done = cli(runtime.settings, "orgs", "create", "--name", "Forgetful EHR Clinic", "--ehr", "fhir",
               "--fhir-base-url", hostile.base, "--fhir-auth", "none", "--json")
    assert done.returncode == 0, done.stderr
    org_id = json.loads(done.stdout)["id"]
    install_application(world.app.id, org_id)
    ana = create_user(org_id, "ana@forgetful.example", "Ana", "Lopez", "alopez", HOSTILE_NPI)
    Authorization.create(application=world.app.id, user=ana.id)
    monday = dt.datetime(2026, 3, 2, 9, 0)
    snapshot = Snapshot.create(organization=org_id, snapshot_date=dt.date.today(), status="complete",
                               completed_at=dt.datetime.utcnow())
    SnapshotAppointment.create(snapshot=snapshot, ehr_appointment_id="ap-1", provider=ana.id, provider_npi=ana.npi,
                               provider_name="Ana", start=monday, end=monday, status="booked", appointment_type="x",
                               patient_id="pt-1", patient_first_name="Jane", patient_last_name="Doe",
                               patient_date_of_birth=dt.date(1970, 1, 2), patient_sex="female")
    client = BulkClient(f"{live}/fhir/r4/{org_id}", mint_platform_token(runtime, live, ana, world.app, org_id))
    start_worker()
    status, headers, body = client.kick_off("/Patient/$export", {"_type": "Patient,Observation"})
    assert status == 202, body
    url = headers["Content-Location"]
    manifest = client.wait(url, timeout=30)
    files = {o["type"]: client.download(o["url"]) for o in manifest["output"]}
    assert [p["id"] for p in files["Patient"]] == ["pt-1"] and [o["id"] for o in files["Observation"]] == ["obs-1"]
    paths = [path for path, _ in hostile.requests()]
    assert paths.count(f"{hostile.base[len(hostile.origin):]}/Patient/$export") == 2, paths
    assert len([p for p in paths if "/$export-status/" in p]) == 4  # each job polled once and DELETEd
    assert any(p.startswith("/fhir/R4/Observation?") for p in paths)  # read per patient instead
    assert "no longer knows" in BulkExport.get_by_id(url.rsplit("/", 1)[1]).ehr_export["fallback"]


def test_file_urls_off_the_ehrs_origin_are_never_followed(runtime, world, live, fhir_ehr, start_worker):
    """A manifest naming files on another host (here svc-auth's own port: an internal address) is not
    followed (refused before any request), so svc-auth's token at the EHR never goes there: the job
    reads per patient."""
    client = _clinic(runtime, world, live, fhir_ehr)
    fhir_ehr.bulk(export=True, polls=0, file_base=f"{live}/fhir/R4")
    start_worker()
    url, _, files = _export(client)
    log = [(c["method"], c["path"].split("/")[1]) for c in fhir_ehr.bulk()["log"]]
    assert ("GET", "$export-file") not in log and log[-1] == ("DELETE", "$export-status")
    assert "origin" in BulkExport.get_by_id(url.rsplit("/", 1)[1]).ehr_export["fallback"]
    _only_the_clinics(files)


def test_deleting_an_export_deletes_the_ehrs_export_too(runtime, world, live, fhir_ehr, start_worker):
    client = _clinic(runtime, world, live, fhir_ehr)
    fhir_ehr.bulk(export=True, polls=1000, retry_after=1)  # the EHR's export never completes
    start_worker()
    status, headers, body = client.kick_off("/Patient/$export", {"_type": "Patient,Observation"})
    assert status == 202, body
    url = headers["Content-Location"]
    export_id = url.rsplit("/", 1)[1]
    wait_until(lambda: any(c["path"].startswith("/$export-status/") for c in fhir_ehr.bulk()["log"]), 60,
               "the worker polling the EHR's export")
    status_url = BulkExport.get_by_id(export_id).ehr_export["status_url"]
    assert client.request("DELETE", url)[0] == 202
    assert ("DELETE", "/" + status_url.split("/fhir/R4/", 1)[1]) in [(c["method"], c["path"]) for c in fhir_ehr.bulk()["log"]]
    assert fhir_ehr.bulk()["jobs"] == 0  # gone at the EHR
    assert client.status(url)[0] == 404
    wait_until(lambda: BulkExport.get_or_none(BulkExport.id == export_id) is None, 30,
               "its build stopped (at its next look at the EHR's export) and its job gone")


def _since_now() -> str:
    """`_since` now: everything seeded before is left out, so a build keeps nothing (no part stored,
    so no checkpoint of its own until a type ends)."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _reading(ehr, more_than: int) -> int:
    return wait_until(lambda: (served := ehr.stats()["fhir"]) > more_than and served, 60, "the build reading the EHR")


def _stopped(ehr) -> dict:
    """The EHR's stats once no FHIR request has been in flight for a second (a build reads it every
    ~0.1 s while it runs)."""
    return wait_until(lambda: (stats := ehr.stats())["idleMs"] > 1000 and stats, 30, "the EHR no longer read")


def test_a_deleted_export_stops_reading_the_ehr_and_leaves_nothing_stored(runtime, world, live, fhir_ehr, start_worker):
    """DELETE mid-type of a slow EHR (0.1 s a request, 32 patients: the type alone takes seconds, and
    `_since` now keeps nothing, so no part is stored): the build stops within one search."""
    client = _clinic(runtime, world, live, fhir_ehr, more=30)
    fhir_ehr.latency(100)
    start_worker()
    before = fhir_ehr.stats()["fhir"]
    status, headers, body = client.kick_off("/Patient/$export", {"_type": "Patient,Observation", "_since": _since_now()})
    assert status == 202, body
    url = headers["Content-Location"]
    export_id = url.rsplit("/", 1)[1]
    _reading(fhir_ehr, before + 3)
    assert client.request("DELETE", url)[0] == 202
    at_delete = fhir_ehr.stats()["fhir"]
    assert client.status(url)[0] == 404
    after = _stopped(fhir_ehr)["fhir"]
    assert after - at_delete <= 2, f"{after - at_delete} EHR requests after the DELETE"
    wait_until(lambda: BulkExport.get_or_none(BulkExport.id == export_id) is None, 30, "the cancelled job removed")
    assert [k for k in bucket_keys(runtime.settings) if k.startswith("bulk/")] == []
    assert BulkExportFile.select().count() == 0


@pytest.mark.svc_settings(workers=True, task_recovery_seconds=RECOVERY_SECONDS, bulk_file_max_bytes=4000,
                          bulk_max_concurrent=1, sync_window=sync_window_closed_now())
def test_kick_off_and_delete_loops_never_build_more_exports_at_once_than_the_cap(
        runtime, world, live, fhir_ehr, start_worker):
    """SVC_BULK_MAX_CONCURRENT=1, a worker with two threads: a DELETEd export counts until its build
    has stopped, so the EHR never serves two exports' searches at once."""
    client = _clinic(runtime, world, live, fhir_ehr, more=30)
    fhir_ehr.latency(100)
    start_worker()

    def admitted():
        status, headers, _ = client.kick_off("/Patient/$export", {"_type": "Patient,Observation", "_since": _since_now()})
        assert status in (202, 429), status
        return headers["Content-Location"] if status == 202 else None
    for _ in range(4):
        before = fhir_ehr.stats()["fhir"]
        url = wait_until(admitted, 30, "a kick-off admitted once the deleted export's build stopped")
        _reading(fhir_ehr, before + 2)
        assert client.kick_off("/Patient/$export", {"_type": "Patient"})[0] == 429
        assert client.request("DELETE", url)[0] == 202
    stats = _stopped(fhir_ehr)
    assert stats["maxInFlight"] == 1, stats
    wait_until(lambda: not BulkExport.select().exists(), 30, "every cancelled job removed")
    assert [k for k in bucket_keys(runtime.settings) if k.startswith("bulk/")] == []


def test_what_a_capability_statement_must_say_to_offer_bulk_export():
    from connectors.fhir.capability import offers_bulk_export
    statement = {"resourceType": "CapabilityStatement", "rest": [{"mode": "server", "resource": [{"type": "Patient"}]}]}
    assert not offers_bulk_export(statement)
    assert offers_bulk_export({**statement, "instantiates": ["http://hl7.org/fhir/uv/bulkdata/CapabilityStatement/bulk-data|2.0.0"]})
    for operation in ({"name": "export"}, {"name": "patient-export"}, {"name": "$export"},
                      {"name": "bulk", "definition": "http://hl7.org/fhir/uv/bulkdata/OperationDefinition/patient-export"}):
        assert offers_bulk_export({**statement, "rest": [{"mode": "server", "resource": [{"type": "Patient", "operation": [operation]}]}]})
        assert offers_bulk_export({**statement, "rest": [{"mode": "server", "operation": [operation]}]})
    assert not offers_bulk_export({**statement, "rest": [{"mode": "client", "operation": [{"name": "export"}]}]})
    assert not offers_bulk_export({**statement, "rest": [{"mode": "server", "resource": [{"type": "Patient", "operation": [
        {"name": "everything"}]}]}]})
    # The EHR's export is asked only for the types svc-auth's token there grants (None: an open server).
    from connectors.fhir.grants import export_types
    assert export_types(("Patient", "Observation", "Goal"), frozenset({"Patient", "Goal"})) == ("Patient", "Goal")
    assert export_types(("Patient", "Observation"), None) == ("Patient", "Observation")


def test_a_worker_killed_mid_ehr_export_resumes_the_ehrs_job_and_lists_no_truncated_file(
        runtime, world, live, fhir_ehr, start_worker):
    client = _clinic(runtime, world, live, fhir_ehr, observations=80)
    fhir_ehr.bulk(export=True, polls=1, retry_after=1, drip_ms=40)  # a file line every 40 ms: the kill lands mid-file
    victim = start_worker()
    status, headers, body = client.kick_off("/Patient/$export", {"_type": "Patient,Observation,Encounter"})
    assert status == 202, body
    url = headers["Content-Location"]
    export_id = url.rsplit("/", 1)[1]

    def mid_type():
        job = BulkExport.get_by_id(export_id)
        files = list(BulkExportFile.select().where(BulkExportFile.export == export_id))
        return job.status == "pending" and job.done_types and any(f.resource_type not in job.done_types for f in files)
    wait_until(mid_type, 60, "a type done and the next one half written")
    victim.kill()
    victim.wait()
    killed = BulkExport.get_by_id(export_id)
    assert killed.status == "pending" and "Observation" not in killed.done_types
    assert killed.ehr_export["status_url"].startswith(fhir_ehr.base + "/$export-status/")
    assert client.status(url)[0] == 202

    start_worker()
    manifest = client.wait(url, timeout=RECOVERY_SECONDS + 90)
    log = [(c["method"], c["path"].split("/")[1]) for c in fhir_ehr.bulk()["log"]]
    assert log.count(("POST", "Patient")) == 1  # the EHR's job was resumed, not kicked off again
    assert BulkExport.get_by_id(export_id).attempts == 2
    found = collections.defaultdict(list)
    for output in manifest["output"]:
        resources = client.download(output["url"])  # whole lines, as many as the manifest says
        assert len(resources) == output["count"]
        found[output["type"]] += resources
    ids = [o["id"] for o in found["Observation"]]
    assert len(ids) == len(set(ids)) == 80 + 3  # 80 heart rates, blood pressure, HbA1c, pt-y's weight
    assert len([o for o in manifest["output"] if o["type"] == "Observation"]) > 1  # split in parts
    _only_the_clinics(found)
    keys = [k for k in bucket_keys(runtime.settings) if k.startswith(f"bulk/{export_id}/")]
    assert sorted(keys) == sorted(f.object_key for f in BulkExportFile.select().where(BulkExportFile.export == export_id))
    assert len(keys) == len(manifest["output"])
