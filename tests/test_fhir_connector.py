"""A clinic on a real FHIR R4 EHR (Medplum's FHIR engine behind SMART Backend Services tokens from
node-oidc-provider): connected with the CLI, its night built by `snapshot run`, its appointments
listed by the partner REST API, and the EHR's faults handled as the connector promises."""
from __future__ import annotations

import base64
import datetime as dt
import json
import time

import pytest

from connectors import APPOINTMENT_STATUSES, Bounds, Provider, connector_for
from connectors.fhir.connector import fhir_state
from workers.activity import record_activity
from lifecycle.activation import set_activation_status
from lifecycle.applications import install_application
from lifecycle.users import create_user
from lifecycle.verification import record_platform_verification
from models.appointments import Snapshot, SnapshotAppointment
from models.directory import Organization
from models.disclosures import DisclosureRecord
from models.schedule import ScheduledRun
from workers.leases import sync_job
from workers.snapshot import COVERAGE, night_window, sync_organization

from helpers.charts import chart_schema_validator, fetch_zip, open_archive, wait_until_not_pending
from helpers.fhir_ehr import (CLIENT_ID, SECRET_NOTE, appointment, chart_record, cli, connect_clinic, patient,
                              practitioner)
from helpers.processes import wait_until
from helpers.rest import partner_headers

pytestmark = pytest.mark.slow

def move_clock_to(clock, when: dt.datetime) -> None:
    clock.offset = 0.0
    clock.advance((when - clock.now()).total_seconds())


def eligible(runtime, app, user, when: dt.datetime) -> None:
    """The user completed the app's flow at `when` (the platform verified a token, which also
    opens their session in the hub)."""
    move_clock_to(runtime.clock, when)
    installation = record_platform_verification(runtime, app, user)
    if installation.activation_status != "Enabled":  # the first launch left it Disabled: the app enables itself
        set_activation_status(runtime, installation, "Enabled", app.id)


async def listed(api, app, secret, org_id: str) -> list[dict]:
    headers, rows, offset = await partner_headers(api, app, secret), [], 0
    while True:
        status, _, body = await api.call("GET", f"/v1/appointments/{org_id}?offset={offset}&limit=50", headers=headers)
        assert status == 200, body
        rows += body["appointments"]
        offset += 50
        if offset >= body["total"]:
            return rows


@pytest.mark.gen_test(timeout=300)
async def test_the_night_of_a_fhir_clinic_lists_exactly_what_the_ehr_holds_for_its_active_physicians(
        api, runtime, world, live, fhir_ehr):
    settings = runtime.settings
    org_id = connect_clinic(settings, fhir_ehr, f"{live}/ehr/jwks.json")
    install_application(world.app.id, org_id)
    ana = create_user(org_id, "ana@fhir.example", "Ana", "Lopez", "alopez", "1417000001")
    ben = create_user(org_id, "ben@fhir.example", "Ben", "Okafor", "bokafor", "1417000019")
    cal = create_user(org_id, "cal@fhir.example", "Cal", "Nguyen", "cnguyen", "1417000027")  # not in the hub
    dee = create_user(org_id, "dee@fhir.example", "Dee", "Park", "dpark", "1417000068")  # never authorized the app
    night = runtime.clock.now().date() + dt.timedelta(days=30)   # a night whose window the test chooses
    start, _ = night_window(settings, night)
    for user in (ana, ben):
        eligible(runtime, world.app, user, start - dt.timedelta(hours=10))   # in the hub the afternoon before
    eligible(runtime, world.app, cal, start - dt.timedelta(days=20))        # long ago: no session that night
    move_clock_to(runtime.clock, start - dt.timedelta(hours=10))
    record_activity(runtime, dee)                                             # in the hub, the app never opened
    day = dt.timedelta(days=1)
    fhir_ehr.seed(
        practitioner("pr-ana", ana.npi, "Lopez", "Ana"), practitioner("pr-ben", ben.npi, "Okafor", "Ben"),
        practitioner("pr-cal", cal.npi, "Nguyen", "Cal"), practitioner("pr-x", "1417000035", "Other", "Xavier"),
        patient("pt-1", "Doe", "Jane", "1970-01-02", "female"), patient("pt-2", "Roe", "Rick", "1955-06-30", "male"),
        appointment("ana-booked", "pr-ana", "pt-1", start + day + dt.timedelta(hours=12)),
        appointment("ana-arrived", "pr-ana", "pt-2", start + 3 * day + dt.timedelta(hours=13), status="arrived"),
        appointment("ana-cancelled", "pr-ana", "pt-1", start + 4 * day, status="cancelled"),
        appointment("ana-noshow", "pr-ana", "pt-1", start + 4 * day + dt.timedelta(hours=1), status="noshow"),
        *[appointment(f"ana-{status}", "pr-ana", "pt-2", start + 5 * day + dt.timedelta(hours=n), status=status)
          for n, status in enumerate(("proposed", "pending", "checked-in", "fulfilled", "waitlist", "entered-in-error"))],
        appointment("ana-after", "pr-ana", "pt-1", start + COVERAGE + dt.timedelta(hours=1)),
        appointment("ana-before", "pr-ana", "pt-1", start - dt.timedelta(hours=1)),
        appointment("cal-booked", "pr-cal", "pt-1", start + 2 * day),
        practitioner("pr-dee", dee.npi, "Park", "Dee"), appointment("dee-booked", "pr-dee", "pt-1", start + 2 * day),
        appointment("x-booked", "pr-x", "pt-2", start + 2 * day),
        # More than a page (100) of Ben's: the connector follows the Bundle's next links.
        *[appointment(f"ben-{n:03d}", "pr-ben", f"pt-{1 + n % 2}", start + dt.timedelta(hours=8 + n * 1.5))
          for n in range(130)])

    done = cli(settings, "snapshot", "run", "--date", night.isoformat(), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert org_id in json.loads(done.stdout)["built"], done.stderr

    rows = await listed(api, world.app, world.secret, org_id)
    expected = {"ana-booked", "ana-arrived", "ana-proposed", "ana-pending", "ana-checked-in",
                *[f"ben-{n:03d}" for n in range(130)]}
    assert sorted(r["id"] for r in rows) == sorted(expected)
    booked = next(r for r in rows if r["id"] == "ana-booked")
    assert booked["status"] == "booked" and booked["appointment_type"] == "Follow-up"
    assert booked["reason"] == "Hypertension follow-up" and booked["location"] == "Main Street Clinic"
    assert booked["provider"]["npi"] == ana.npi
    assert booked["patient"] == {"id": "pt-1", "first_name": "Jane", "last_name": "Doe",
                                 "date_of_birth": "1970-01-02", "sex": "female"}
    assert next(r for r in rows if r["id"] == "ana-arrived")["status"] == "arrived"
    assert {r["status"] for r in rows} <= set(APPOINTMENT_STATUSES)   # FHIR codes, as on a sandbox clinic

    check = cli(settings, "ehr", "check", "--org", org_id, "--json")
    verdict = json.loads(check.stdout)
    assert check.returncode == 0 and verdict["ok"], verdict
    assert [s["step"] for s in verdict["steps"]] == ["discovery", "token", "scopes", "practitioner", "appointments"]


@pytest.mark.svc_settings(task_min_backoff_ms=50, task_max_backoff_ms=200)
def test_ehr_faults_429_backoff_token_renewal_outage_and_a_revoked_registration(runtime, world, live, fhir_ehr,
                                                                                caplog):
    settings = runtime.settings
    org_id = connect_clinic(settings, fhir_ehr, f"{live}/ehr/jwks.json", name="Faulty Clinic")
    ana = create_user(org_id, "ana@faulty.example", "Ana", "Lopez", "alopez", "1417000043")
    start = dt.datetime.combine(runtime.clock.now().date(), dt.time(0, 0)) + dt.timedelta(days=1)
    fhir_ehr.seed(practitioner("pr-ana", ana.npi, "Lopez", "Ana"), patient("pt-1", "Doe", "Jane", "1970-01-02", "female"),
                  appointment("a-1", "pr-ana", "pt-1", start + dt.timedelta(hours=14)))
    provider = Provider(user_id=ana.id, npi=ana.npi, name="Ana Lopez")
    organization = Organization.get_by_id(org_id)

    def read() -> list[str]:
        return [a.id for a in connector_for(runtime, organization).fetch_appointments(provider, start, start + COVERAGE)]

    assert read() == ["a-1"]
    tokens = fhir_ehr.stats()["token"]

    # A 429 storm: each answer's Retry-After is waited out, then the read completes.
    fhir_ehr.fault(429, count=3, retry_after=0.4)
    began = time.monotonic()
    assert read() == ["a-1"]
    assert time.monotonic() - began >= 3 * 0.4
    assert fhir_ehr.stats()["faults"] >= 3

    # svc-auth's token expires early at the EHR (401 invalid_token): one new token, the read completes.
    fhir_ehr.expire_tokens()
    assert read() == ["a-1"]
    assert fhir_ehr.stats()["token"] == tokens + 1
    # The EHR forgets every token (a new token service): the same, once more.
    fhir_ehr.register(CLIENT_ID, f"{live}/ehr/jwks.json")
    assert read() == ["a-1"]
    assert fhir_ehr.stats()["token"] == tokens + 2

    # The EHR down for the night's first attempt (every one of the connector's own tries answered
    # 503): the task fails as unavailable, the queue retries it after its backoff, and the night
    # completes with the EHR's appointment.
    night = runtime.clock.now().date() + dt.timedelta(days=30)
    install_application(world.app.id, org_id)
    eligible(runtime, world.app, ana, night_window(settings, night)[0] - dt.timedelta(hours=10))
    fhir_ehr.seed(appointment("a-night", "pr-ana", "pt-1", night_window(settings, night)[0] + dt.timedelta(hours=20)))
    faults = fhir_ehr.stats()["faults"]
    attempts = Bounds.batch(settings).attempts                    # the night's tries per request
    fhir_ehr.fault(503, count=attempts, retry_after=0)
    runtime.task_queue.send(sync_organization, org_id, night.isoformat())
    wait_until(lambda: Snapshot.select().where((Snapshot.organization == org_id) & (Snapshot.snapshot_date == night)
                                               & (Snapshot.status == "complete")).exists(), what="the night, retried")
    assert fhir_ehr.stats()["faults"] == faults + attempts        # the whole first attempt met the outage
    snapshot = Snapshot.get((Snapshot.organization == org_id) & (Snapshot.snapshot_date == night))
    assert [a.ehr_appointment_id for a in SnapshotAppointment.select().where(SnapshotAppointment.snapshot == snapshot)] \
        == ["a-night"]
    # The EHR staying down: `snapshot run` says it is unavailable (the scheduler retries the night)
    # and the night built before stays served.
    fhir_ehr.fault(503, count=1000, retry_after=0)
    down = cli(settings, "snapshot", "run", "--date", night.isoformat(), "--json")
    assert down.returncode == 1 and "unavailable" in (down.stdout + down.stderr)
    assert Snapshot.latest_complete(org_id).id == snapshot.id
    fhir_ehr.fault(503, count=0)

    # A revoked registration: a permanent failure that says what to fix.
    fhir_ehr.revoke()
    fhir_state(runtime).tokens.drop((f"{fhir_ehr.origin}/oauth/token", CLIENT_ID))
    check = cli(settings, "ehr", "check", "--org", org_id, "--json")
    verdict = json.loads(check.stdout)
    assert check.returncode == 1 and not verdict["ok"]
    token_step = next(s for s in verdict["steps"] if s["step"] == "token")
    assert not token_step["ok"] and CLIENT_ID in token_step["detail"] and "jwks" in token_step["detail"].lower()
    next_night = night + dt.timedelta(days=1)
    eligible(runtime, world.app, ana, night_window(settings, next_night)[0] - dt.timedelta(hours=10))
    refused = cli(settings, "snapshot", "run", "--date", next_night.isoformat(), "--json")
    assert refused.returncode == 1
    assert "failed: The EHR's token endpoint refused svc-auth" in json.loads(refused.stdout)["organizations"][org_id]
    # The scheduled night: failed for good (not retried), with the same words in the log.
    runtime.task_queue.send(sync_organization, org_id, next_night.isoformat())
    wait_until(lambda: ScheduledRun.select().where((ScheduledRun.job == sync_job("sync-failed", org_id))
                                                   & (ScheduledRun.run_date == next_night)).exists(),
               what="the night failed for good")
    logged = [r.getMessage() for r in caplog.records if r.name == "svc_auth.snapshot" and r.levelname == "ERROR"]
    assert any("failed for good: The EHR's token endpoint refused svc-auth" in m and CLIENT_ID in m
               and "/ehr/jwks.json" in m for m in logged), logged


async def chart_of(api, headers, runtime, app_id: str, org_id: str, patient_id: str) -> tuple[str, dict]:
    """Request a patient's chart through the REST API; (the PDF's text, the JSON) of its ZIP."""
    status, _, created = await api.call("POST", "/v1/chart-retrieval/requests",
                                        {"svc_organization_id": org_id, "patient_id": patient_id}, headers=headers)
    assert status == 202, created
    done = await wait_until_not_pending(api, headers, created["request_id"], timeout=120)
    assert done["status"] == "ready", done
    status, _, body = await api.call("GET", f"/v1/chart-retrieval/download-url/{created['request_id']}", headers=headers)
    response = await fetch_zip(api, body["download_url"], runtime)
    return open_archive(response.body, created["request_id"], app_id)


def held_ids(chart: dict) -> dict[str, list[str]]:
    """The FHIR ids a chart JSON holds, by resource type."""
    return {"Condition": sorted(p["id"] for p in chart["problems"]),
            "MedicationRequest": sorted(m["id"] for m in chart["medications"]),
            "AllergyIntolerance": sorted(a["id"] for a in chart["allergies"]),
            "Encounter": sorted(e["id"] for e in chart["encounters"]),
            "Observation": sorted(o["id"] for o in chart["observations"]),
            "DocumentReference": sorted(d["id"] for d in chart["documents"])}


@pytest.mark.gen_test(timeout=300)
async def test_a_chart_request_for_a_fhir_patient_yields_the_zip_of_that_patients_resources(
        api, runtime, world, live, fhir_ehr):
    """$everything where the CapabilityStatement offers it (read once per runtime), the searches by
    patient where it does not: the same chart, holding exactly the patient's resources on the EHR."""
    org_id = connect_clinic(runtime.settings, fhir_ehr, f"{live}/ehr/jwks.json", name="Charts Clinic")
    install_application(world.app.id, org_id)
    fhir_ehr.seed(patient("pt-7", "Doe", "Jane", "1970-01-02", "female"),
                  *chart_record("pt-7", encounters=230, observations=40, documents=3))
    headers = await partner_headers(api, world.app, world.secret)
    on_the_ehr = {kind: sorted(ids) for kind, ids in fhir_ehr.compartment("pt-7").items() if kind != "Patient"}
    assert {kind: len(ids) for kind, ids in on_the_ehr.items()} == {
        "Condition": 2, "MedicationRequest": 1, "AllergyIntolerance": 1, "Encounter": 230, "Observation": 42,
        "DocumentReference": 3}

    text, chart = await chart_of(api, headers, runtime, world.app.id, org_id, "pt-7")
    validator = await chart_schema_validator(api)          # the one shape, as on a sandbox clinic
    assert not [e.message for e in validator.iter_errors(chart)]
    assert all("vitals" not in e for e in chart["encounters"])
    pages = fhir_ehr.stats()["pages"]
    assert pages == {"Patient/$everything": 3}          # 279 resources, 100 a page, no searches
    # The disclosure audit: one ehr.fetch record per read from the EHR (the Patient, 3 pages), each
    # naming the patient whose data it carried (the CapabilityStatement is none).
    fetches = list(DisclosureRecord.select().where((DisclosureRecord.organization_id == org_id)
                                                   & (DisclosureRecord.action == "ehr.fetch")).order_by(DisclosureRecord.seq))
    assert [(f.action, f.outcome, f.resource_type, f.status) for f in fetches] == [
        ("ehr.fetch", "success", "Patient", None)] * 4
    assert fetches[0].resource_ids == ["pt-7"] and fetches[1].query.startswith("_type=")
    assert {p for f in fetches for p in f.patients} == {"pt-7"} and all(f.patients for f in fetches)
    assert {(f.application_id, f.client_id, f.user_id) for f in fetches} == {(world.app.id, world.app.client_id, None)}
    assert sum(len(f.resource_ids) for f in fetches[1:]) >= 279
    assert held_ids(chart) == on_the_ehr                # nothing of someone-else's, nothing missing
    assert chart["patient"] == {"id": "pt-7", "first_name": "Jane", "last_name": "Doe", "date_of_birth": "1970-01-02",
                                "sex": "female"}
    assert {p["description"] for p in chart["problems"]} == {"Essential hypertension", "Type 2 diabetes"}
    assert chart["medications"] == [{"id": "med-1", "name": "Metformin 500 mg tablet", "dose": "500 mg",
                                     "frequency": "twice daily with meals", "started": "2021-09-20",
                                     "status": "active"}]
    assert chart["allergies"] == [{"id": "alg-1", "substance": "Penicillin", "reaction": "Hives",
                                   "severity": "moderate"}]
    assert {e["provider"] for e in chart["encounters"]} == {"Dr. Ana Lopez"}
    observations = {o["id"]: o for o in chart["observations"]}
    assert observations["obs-bp"] == {"id": "obs-bp", "date": "2024-03-01", "category": "Vital Signs",
                                      "code": "85354-9", "name": "Blood pressure panel", "value": "128/82",
                                      "unit": "mm[Hg]", "interpretation": ""}
    assert observations["obs-a1c"] == {"id": "obs-a1c", "date": "2024-03-02", "category": "Laboratory",
                                       "code": "4548-4", "name": "Hemoglobin A1c", "value": "7.1", "unit": "%",
                                       "interpretation": "High"}
    assert observations["obs-0007"]["value"] == "67" and observations["obs-0007"]["unit"] == "/min"
    assert chart["documents"][0] == {"id": "doc-0", "date": "2024-02-01", "title": "Discharge summary 0",
                                     "type": "Discharge summary", "category": "Clinical Note", "status": "current",
                                     "content_type": "text/plain"}
    flat = text.replace("\n", " ")
    assert "Essential hypertension" in text and "Metformin 500 mg tablet" in text and "Penicillin: Hives" in text
    assert "Office visit with Dr. Ana Lopez" in text
    assert "Blood pressure panel: 128/82 mm[Hg]" in flat and "Hemoglobin A1c: 7.1 % [High]" in flat
    assert "Discharge summary 2" in flat and "(Discharge summary, text/plain)" in flat
    held = json.dumps(chart)   # what documents are, never their content
    assert SECRET_NOTE not in text and SECRET_NOTE not in held and base64.b64encode(SECRET_NOTE.encode()).decode() not in held

    _, again = await chart_of(api, headers, runtime, world.app.id, org_id, "pt-7")
    assert fhir_ehr.stats()["metadata"] == 1            # the CapabilityStatement is read once per runtime
    assert held_ids(again) == on_the_ehr

    # An EHR without $everything: the connector searches by patient, type by type, page by page.
    fhir_ehr.offer_everything(False)
    fhir_state(runtime).capabilities.drop(fhir_ehr.base)        # as an hour later
    _, searched = await chart_of(api, headers, runtime, world.app.id, org_id, "pt-7")
    pages = fhir_ehr.stats()["pages"]
    assert pages["Patient/$everything"] == 6 and pages["Encounter"] == 3 and pages["Observation"] == 1
    assert pages["DocumentReference"] == 1 and pages["Condition"] == 1
    assert held_ids(searched) == on_the_ehr and not list(validator.iter_errors(searched))
    assert {k: v for k, v in searched.items() if k != "request_id"} == {k: v for k, v in chart.items()
                                                                       if k != "request_id"}

    status, _, missing = await api.call("POST", "/v1/chart-retrieval/requests",
                                        {"svc_organization_id": org_id, "patient_id": "no-such-patient"}, headers=headers)
    failed = await wait_until_not_pending(api, headers, missing["request_id"], timeout=60)
    assert failed["status"] == "failed" and "no-such-patient" in failed["error"]
    last = DisclosureRecord.select().where(DisclosureRecord.action == "ehr.fetch").order_by(DisclosureRecord.seq.desc()).get()
    assert (last.outcome, last.resource_type, last.patients) == ("failure", "Patient", ["no-such-patient"])


@pytest.mark.gen_test(timeout=300)
async def test_a_chart_holds_nothing_about_another_patient_that_merely_names_this_one(api, runtime, world, live, fhir_ehr):
    """A mother's chart held her child's records: R4's Patient compartment (what `$everything`
    answers) also takes in what she asserted, recorded, performed or wrote about someone else (a
    Condition's `asserter`, an AllergyIntolerance's `recorder`, an Observation's `performer`, a
    DocumentReference's `author`), and the chart kept every resource of her compartment, so the
    child's asthma was listed as her problem. A chart holds only what is about its patient: the
    resource's `subject` (`patient` for an AllergyIntolerance)."""
    org_id = connect_clinic(runtime.settings, fhir_ehr, f"{live}/ehr/jwks.json", name="Family Clinic")
    install_application(world.app.id, org_id)
    mother, child = {"reference": "Patient/pt-7"}, {"reference": "Patient/pt-kid"}
    about_the_child = [
        {"resourceType": "Condition", "id": "cond-kid", "subject": child, "asserter": mother,
         "code": {"text": "Childhood asthma"}},
        {"resourceType": "AllergyIntolerance", "id": "alg-kid", "patient": child, "recorder": mother,
         "code": {"text": "Peanut"}},
        {"resourceType": "Observation", "id": "obs-kid", "status": "final", "subject": child, "performer": [mother],
         "code": {"text": "Peak flow"}, "effectiveDateTime": "2024-03-03", "valueQuantity": {"value": 250, "unit": "L/min"}},
        {"resourceType": "DocumentReference", "id": "doc-kid", "status": "current", "subject": child,
         "author": [mother], "date": "2024-03-04T00:00:00Z", "type": {"text": "School asthma plan"},
         "content": [{"attachment": {"contentType": "text/plain", "title": "Asthma plan"}}]}]
    fhir_ehr.seed(patient("pt-7", "Doe", "Jane", "1970-01-02", "female"),
                  patient("pt-kid", "Doe", "Jimmy", "2015-06-07", "male"),
                  *chart_record("pt-7", encounters=2), *about_the_child)
    headers = await partner_headers(api, world.app, world.secret)
    kid_ids = {r["id"] for r in about_the_child}
    in_compartment = {i for ids in fhir_ehr.compartment("pt-7").values() for i in ids}
    assert kid_ids <= in_compartment  # what $everything answers for the mother

    for everything in (True, False):  # $everything, and the searches by patient
        fhir_ehr.offer_everything(everything)
        fhir_state(runtime).capabilities.drop(fhir_ehr.base)
        text, chart = await chart_of(api, headers, runtime, world.app.id, org_id, "pt-7")
        held = {i for ids in held_ids(chart).values() for i in ids}
        assert not held & kid_ids, (everything, held & kid_ids)
        flat = text.replace("\n", " ")
        for words in ("Childhood asthma", "Peanut", "Peak flow", "School asthma plan"):
            assert words not in flat and words not in json.dumps(chart), (everything, words)
        assert {"cond-htn", "cond-dm", "alg-1", "obs-bp"} <= held  # hers are all there


def test_a_fhir_clinics_physician_signs_in_to_the_sandbox_hub(runtime):
    """With the sandbox on, its hub serves a FHIR clinic's users too (how they complete the flow in
    tests and demos); a clinic on an EHR svc-auth has no connector for stays outside."""
    settings = runtime.settings
    created = cli(settings, "orgs", "create", "--name", "Hub Clinic", "--ehr", "fhir", "--fhir-base-url",
                  "https://ehr.example/fhir/R4", "--fhir-client-id", CLIENT_ID, "--json")
    org_id = json.loads(created.stdout)["id"]
    doc = create_user(org_id, "doc@hub.example", "Doc", "Hub", "dhub", "1417000050")
    link = cli(settings, "sandbox", "signin-link", "--user", doc.id, "--json")
    assert link.returncode == 0 and json.loads(link.stdout)["url"].startswith(settings.public_url), link.stderr
    other = cli(settings, "orgs", "create", "--name", "Elsewhere", "--ehr", "epic", "--json")
    outsider = create_user(json.loads(other.stdout)["id"], "doc@elsewhere.example", "Doc", "Else", "delse")
    refused = cli(settings, "sandbox", "signin-link", "--user", outsider.id)
    assert refused.returncode != 0 and "sandbox or a FHIR EHR" in refused.stderr


def test_an_organization_on_fhir_needs_its_base_url_and_client_id(runtime):
    settings = runtime.settings
    missing = cli(settings, "orgs", "create", "--name", "No URL", "--ehr", "fhir", "--fhir-client-id", "x")
    assert missing.returncode == 2 and "--fhir-base-url" in missing.stderr
    no_client = cli(settings, "orgs", "create", "--name", "No client", "--ehr", "fhir",
                    "--fhir-base-url", "https://ehr.example/fhir/R4")
    assert no_client.returncode == 2 and "--fhir-client-id" in no_client.stderr
    open_server = cli(settings, "orgs", "create", "--name", "Open", "--ehr", "fhir",
                      "--fhir-base-url", "https://ehr.example/fhir/R4", "--fhir-auth", "none", "--json")
    assert open_server.returncode == 0, open_server.stderr
    assert json.loads(open_server.stdout)["fhir_auth"] == "none"


@pytest.mark.gen_test
async def test_the_ehr_jwks_publishes_the_public_half_only(api):
    status, headers, body = await api.call("GET", "/ehr/jwks.json")
    assert status == 200 and body["keys"] and headers["Access-Control-Allow-Origin"] == "*"
    assert all(k["alg"] == "RS384" and k["kty"] == "RSA" and "d" not in k for k in body["keys"])


def test_the_documented_local_try_it_passes_every_check(fhir_ehr, live, settings, tmp_path):
    """docs/ehr-fhir.md's try-it on your own machine, run as written (the EHR already running here,
    its port and the service's swapped in): register, seed, connect, a physician, `ehr check` all ok."""
    import os
    import re
    import subprocess
    import sys
    from helpers.environment import ROOT
    from helpers.processes import settings_env
    fhir_ehr.admin("reset", {})
    section = (ROOT / "docs" / "ehr-fhir.md").read_text().split("To try steps 1 to 3 on your own machine", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    assert block.startswith("node tests/js/fhir_ehr.mjs --port 9000 &")
    script = "set -e\n" + "\n".join(line for line in block.splitlines() if not line.startswith("node "))
    script = script.replace("127.0.0.1:9000", fhir_ehr.origin.split("//")[1]).replace("127.0.0.1:8888", live.split("//")[1])
    env = settings_env(settings, SVC_ISSUER=live, SVC_PUBLIC_URL=live)
    env["PATH"] = f"{os.path.dirname(sys.executable)}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    done = subprocess.run(["bash", "-c", script], env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    steps = [line.split(":", 2)[:2] for line in done.stdout.splitlines() if re.match(r"^[a-z]+: (ok|FAILED)", line)]
    assert steps == [[name, " ok"] for name in ("discovery", "token", "scopes", "practitioner", "appointments")], done.stdout
