"""R4-valid ids (issue 35, item 4) and the disclosure audit's FHIR export (item 5).

Every id the FHIR API serves on a sandbox clinic is R4's `id` type (the pattern of HL7's R4 JSON
Schema), and what it serves validates (`helpers.r4.r4_problems`: Medplum's `validateResource` and
HL7's R4 JSON Schema); a request naming an id in the spelling before issue 35 (`pat_…`, `usr_…`)
is still answered; migration 3504 converts stored ids on SQLite and PostgreSQL, keeps every row,
leaves the append-only disclosure records alone, and the previous release still reads the database.
"""
from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
import sys

import pytest

from audit.disclosures import Disclosure, record
from connectors.sandbox import patient_panel
from helpers.charts import fetch_zip, open_archive, wait_until_not_pending
from helpers.environment import ROOT
from helpers.fhir_api import Fhir, resources
from helpers.fhir_ehr import cli
from helpers.http import http
from helpers.processes import free_port, settings_env, stop_process, wait_for_port
from helpers.r4 import R4_SCHEMA, r4_problems, references
from helpers.rest import complete_snapshot, partner_headers
from helpers.tokens import mint_platform_token
from helpers.worlds import SMART_PATIENT
from fhir_api.search import SUPPORTED_TYPES
from lifecycle.activation import set_activation_status
from lifecycle.verification import record_platform_verification
from models.appointments import SnapshotAppointment
from models.charts import ChartRequest
from models.disclosures import DisclosureRecord
from models.grants import AuthorizationCode, Launch
from models.ids import fhir_id
from models.schema import SchemaVersion, migrate

OLD_PATIENT = SMART_PATIENT.replace("-", "_")
"""The demo patient as ids were spelled before issue 35 (`pat_b15c092f2447b7a2`)."""
PREVIOUS_RELEASE = "e664ac1"
"""main before issue 35 (the commit every branch of this round starts from)."""


def r4_id_type() -> re.Pattern:
    """R4's id type as HL7's R4 JSON Schema states it (not our own `models.ids.R4_ID`)."""
    return re.compile(json.loads(R4_SCHEMA.read_text())["definitions"]["id"]["pattern"].strip("^$"))


@pytest.mark.parametrize("backend", ["sqlite"])
def test_every_id_the_fhir_api_serves_on_the_sandbox_is_r4_and_validates(live, runtime, world):
    """A walk over every served type (a page of each, and one patient's); each type's first resources read back."""
    fhir = Fhir(live, world.org.id, mint_platform_token(runtime, live, world.physician, world.app, world.org.id))
    patient = patient_panel(world.org.id)[0].id
    served, bundles = {}, []
    for kind in SUPPORTED_TYPES:
        for params in ({"_count": 100}, {"patient": patient, "_count": 100}):
            status, _, bundle = fhir.get(f"/{kind}", params)
            if status == 400 and "patient" in params:
                continue  # a type not searched by patient (Practitioner)
            assert status == 200, (kind, params, bundle)
            bundles.append(bundle)
            served.update({(r["resourceType"], r["id"]): r for r in resources(bundle)})
    kinds = {kind for kind, _ in served}
    assert kinds >= set(SUPPORTED_TYPES) - {"MedicationRequest", "AllergyIntolerance"}, kinds  # some have none
    id_type = r4_id_type()
    assert [key for key in served if not id_type.fullmatch(key[1])] == []
    tails = [ref.split("/_history/")[0].rsplit("/", 1)[1] for b in bundles for ref in references(b) if "/" in ref]
    assert tails and [t for t in tails if not id_type.fullmatch(t)] == []
    assert patient in {ident for kind, ident in served if kind == "Patient"} and patient.startswith("pat-")
    assert ("Practitioner", fhir_id(world.physician.id)) in served
    for kind in kinds:  # each type's first few read back (the token's rate limit is 200 a minute)
        for ident in [ident for k, ident in served if k == kind][:5]:
            assert fhir.ok(f"/{kind}/{ident}") == served[(kind, ident)]
    problems = r4_problems(bundles)
    assert [p for p in problems if p] == []


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_request_naming_an_old_id_is_still_answered(live, runtime, world):
    """Path ids, `_id`, references and a token's patient in the spelling before issue 35."""
    fhir = Fhir(live, world.org.id, mint_platform_token(runtime, live, world.physician, world.app, world.org.id))
    patient = patient_panel(world.org.id)[0].id
    old = patient.replace("-", "_")
    assert fhir.ok(f"/Patient/{old}")["id"] == patient
    encounters = resources(fhir.search("Encounter", {"patient": old, "_count": 3}))
    assert encounters and encounters == resources(fhir.search("Encounter", {"patient": patient, "_count": 3}))
    assert fhir.ok(f"/Encounter/{encounters[0]['id'].replace('-', '_')}") == encounters[0]
    observations = resources(fhir.search("Observation", {"subject": f"Patient/{old}", "_count": 5}))
    assert observations and all(o["subject"]["reference"] == f"Patient/{patient}" for o in observations)
    old_ids = ",".join(o["id"].replace("-", "_") for o in observations)
    assert resources(fhir.search("Observation", {"_id": old_ids, "_count": 5})) == observations
    # The Practitioner is the user id in R4's spelling; the user id itself names it too.
    practitioner = fhir.ok(f"/Practitioner/{world.physician.id}")
    assert "_" in world.physician.id and practitioner["id"] == world.physician.id.replace("_", "-")
    by_old = fhir.search("Appointment", {"practitioner": f"Practitioner/{world.physician.id}", "_count": 10})
    by_new = fhir.search("Appointment", {"practitioner": f"Practitioner/{practitioner['id']}", "_count": 10})
    assert by_old["total"] and resources(by_old) == resources(by_new)
    # A token issued before carries its launch's patient in the old spelling: still that compartment.
    narrow = Fhir(live, world.org.id, mint_platform_token(runtime, live, world.physician, world.app, world.org.id,
                                                          scope="openid patient/*.rs", patient=old))
    assert narrow.ok(f"/Patient/{patient}")["id"] == patient
    assert resources(narrow.search("Encounter", {"_count": 3})) == encounters
    # The audit names the patient by its one id, whatever the request spelled.
    named = {p for row in DisclosureRecord.select() for p in row.patients}
    assert patient in named and old not in named


@pytest.mark.gen_test(timeout=90)
async def test_a_chart_request_naming_the_old_spelling_charts_that_patient(api, world, runtime):
    headers = await partner_headers(api, world.app, world.secret)
    patient = patient_panel(world.org.id)[0].id
    status, _, created = await api.call("POST", "/v1/chart-retrieval/requests", {
        "svc_organization_id": world.org.id, "patient_id": patient.replace("-", "_")}, headers=headers)
    assert status == 202, created
    request_id = created["request_id"]
    done = await wait_until_not_pending(api, headers, request_id)
    assert done["status"] == "ready", done
    assert patient.startswith("pat-") and ChartRequest.get_by_id(request_id).patient_id == patient
    status, _, body = await api.call("GET", f"/v1/chart-retrieval/download-url/{request_id}", headers=headers)
    _, chart = open_archive((await fetch_zip(api, body["download_url"], runtime)).body, request_id, world.app.id)
    assert chart["patient"]["id"] == patient
    requested = DisclosureRecord.get(DisclosureRecord.action == "chart.request")
    assert requested.patients == [patient]


def _records_before_and_after(runtime, org_id: str) -> None:
    """One record written before issue 35 (it keeps `pat_…`: records are append-only), two after."""
    record(runtime, Disclosure(action="read", organization_id=org_id, resource_type="Patient", request_id="r-old"),
           "success", 200, [OLD_PATIENT], [OLD_PATIENT])
    record(runtime, Disclosure(action="search", organization_id=org_id, resource_type="Encounter",
                               query=f"patient={SMART_PATIENT}", request_id="r-new"),
           "success", 200, [SMART_PATIENT], [f"enc-{SMART_PATIENT[4:]}-0"])
    record(runtime, Disclosure(action="read", organization_id=org_id, resource_type="Patient", request_id="r-other"),
           "success", 200, ["pat-0000000000000000"], ["pat-0000000000000000"])


def test_audit_finds_a_patient_under_both_spellings(runtime, world):
    _records_before_and_after(runtime, world.org.id)
    for spelling in (OLD_PATIENT, SMART_PATIENT):
        found = json.loads(cli(runtime.settings, "audit", "disclosures", "--org", world.org.id, "--patient", spelling,
                               "--json").stdout)
        assert [r["request_id"] for r in found] == ["r-old", "r-new"], spelling


def test_the_audits_fhir_export_is_valid_r4(runtime, world):
    """`--format fhir` (IHE BALP AuditEvents) passes Medplum's validator (bdl-1: no `total` on a
    collection) and HL7's R4 JSON Schema, an older record's references included."""
    _records_before_and_after(runtime, world.org.id)
    bundle = json.loads(cli(runtime.settings, "audit", "disclosures", "--org", world.org.id, "--format", "fhir").stdout)
    assert bundle["type"] == "collection" and len(bundle["entry"]) == 3
    assert r4_problems([bundle]) == [[]]
    assert f"Patient/{SMART_PATIENT}" in references(bundle["entry"][0]["resource"])  # the older record's


def _previous_schema_with_old_ids(runtime, world) -> dict:
    """The database as the previous release leaves it: migration 3504 not applied, sandbox ids
    with `_`, next to an EHR's own ids (which never change)."""
    SchemaVersion.delete().where(SchemaVersion.version == 3504).execute()
    installation = record_platform_verification(runtime, world.app, world.physician)  # the partner API lists
    set_activation_status(runtime, installation, "Enabled", "test")  # providers who signed in, if Enabled
    snapshot = complete_snapshot(runtime.clock, world.org, [world.physician], per_provider=4)
    rows = list(SnapshotAppointment.select().where(SnapshotAppointment.snapshot == snapshot.id)
                .order_by(SnapshotAppointment.id))
    ehr_patient = "7c1e9f2a-5b3d-4e6f-8a9b-0c1d2e3f4a5b"
    for n, row in enumerate(rows):
        old = n % 2 == 0
        SnapshotAppointment.update(patient_id=OLD_PATIENT if old else ehr_patient,
                                   ehr_appointment_id=f"apt_{n:016x}" if old else f"ehr-{n}").where(
            SnapshotAppointment.id == row.id).execute()
    now = runtime.clock.now()
    chart = ChartRequest.create(application=world.app.id, organization=world.org.id, patient_id=OLD_PATIENT,
                                created_at=now, status="ready", ready_at=now)
    ehr_chart = ChartRequest.create(application=world.app.id, organization=world.org.id, patient_id=ehr_patient,
                                    created_at=now, status="ready", ready_at=now)
    launch = Launch.create(id="launch-old", application=world.app.id, user=world.physician.id, organization=world.org.id,
                           expires_at=now + dt.timedelta(minutes=5), patient_id=OLD_PATIENT)
    AuthorizationCode.create(code_hash="h" * 64, application=world.app.id, user=world.physician.id,
                             organization=world.org.id, launch=launch.id, redirect_uri="https://app.example/cb",
                             expires_at=now + dt.timedelta(minutes=1), patient_id=OLD_PATIENT)
    record(runtime, Disclosure(action="read", organization_id=world.org.id, resource_type="Patient"),
           "success", 200, [OLD_PATIENT], [OLD_PATIENT])
    return {"snapshot": snapshot, "rows": len(rows), "chart": chart.id, "ehr_chart": ehr_chart.id,
            "ehr_patient": ehr_patient, "audit": [(r.seq, r.mac, r.patients) for r in DisclosureRecord.select()]}


def test_migration_3504_converts_stored_sandbox_ids_and_keeps_every_row(runtime, world, tmp_path):
    before = _previous_schema_with_old_ids(runtime, world)
    done = migrate(runtime.db)
    assert [d for d in done if d.startswith("migration ")] == [
        "migration 3504: sandbox ids in R4's spelling (pat-…, apt-…) in appointments, chart requests, launches "
        "and codes"]
    rows = list(SnapshotAppointment.select().where(SnapshotAppointment.snapshot == before["snapshot"].id)
                .order_by(SnapshotAppointment.id))
    assert len(rows) == before["rows"] == 4
    assert [r.patient_id for r in rows] == [SMART_PATIENT, before["ehr_patient"]] * 2
    assert [r.ehr_appointment_id for r in rows] == [f"apt-{0:016x}", "ehr-1", f"apt-{2:016x}", "ehr-3"]
    assert ChartRequest.get_by_id(before["chart"]).patient_id == SMART_PATIENT
    assert ChartRequest.get_by_id(before["ehr_chart"]).patient_id == before["ehr_patient"]
    assert Launch.get_by_id("launch-old").patient_id == SMART_PATIENT
    assert AuthorizationCode.get_by_id("h" * 64).patient_id == SMART_PATIENT
    # The disclosure records are not rewritten (append-only, chained): they still verify.
    assert [(r.seq, r.mac, r.patients) for r in DisclosureRecord.select()] == before["audit"]
    assert json.loads(cli(runtime.settings, "audit", "verify", "--json").stdout)["ok"] is True
    assert migrate(runtime.db) == []  # applied once

    # The previous release reads the migrated database: it starts, serves the partner API's
    # appointments (the new spelling, as any id) and chart requests, and does not crash.
    previous = tmp_path / "previous"
    previous.mkdir()
    archive = subprocess.run(["git", "archive", PREVIOUS_RELEASE], cwd=str(ROOT), capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(previous)], input=archive.stdout, check=True)
    port = free_port()
    issuer = f"http://127.0.0.1:{port}"
    env = settings_env(runtime.settings, SVC_ISSUER=issuer, SVC_PUBLIC_URL=issuer)
    env["PYTHONPATH"] = str(previous)
    proc = subprocess.Popen([sys.executable, "-m", "cli.__main__", "serve", "--port", str(port)], cwd=str(previous),
                            env=env, stdout=open(tmp_path / "previous.log", "wb"), stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, proc=proc)
        status, _, body = http("POST", f"{issuer}/v1/oauth/token", json.dumps({
            "grant_type": "client_credentials", "client_id": world.app.client_id,
            "client_secret": world.secret}).encode(), {"Content-Type": "application/json"})
        assert status == 200, body
        auth = {"Authorization": f"Bearer {json.loads(body)['access_token']}"}
        status, _, body = http("GET", f"{issuer}/v1/appointments/{world.org.id}", None, auth)
        assert status == 200, body
        patients = [a["patient"]["id"] for a in json.loads(body)["appointments"]]
        assert sorted(patients) == sorted([SMART_PATIENT, before["ehr_patient"]] * 2)
        status, _, body = http("GET", f"{issuer}/v1/chart-retrieval/requests/{before['chart']}", None, auth)
        assert status == 200 and json.loads(body)["status"] == "ready", body
    finally:
        stop_process(proc)
    assert b"Traceback" not in (tmp_path / "previous.log").read_bytes()
