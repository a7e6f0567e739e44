"""One vocabulary whatever the clinic's EHR (CONTRACTS, "One vocabulary for every EHR"), over HTTP
on both databases: `fhirUser` resolves with the launch's own access token on a sandbox clinic and on
a FHIR clinic (the Medplum-based test EHR), also when the token has no Practitioner scope (the
`fhirUser` scope reads that one Practitioner, nothing more), appointment statuses are FHIR AppointmentStatus codes,
and the chart JSON validates against the schema served at `GET /v1/schemas/chart.json` (a FHIR
clinic's chart and night: tests/test_fhir_connector.py)."""
from __future__ import annotations

import datetime as dt
import json

import pytest
from jose import jwt

from helpers.charts import chart_schema_validator, open_archive, wait_until_not_pending
from helpers.fhir_api import Fhir, outcome
from helpers.fhir_ehr import CLIENT_ID, cli, connect_clinic, practitioner
from helpers.rest import partner_headers
from helpers.smart import launch_tokens
from connectors import APPOINTMENT_STATUSES, ResourceQuery, connector_for
from workers.activity import record_activity
from lifecycle.applications import install_application, set_smart_scopes
from lifecycle.users import create_user, update_user
from lifecycle.activation import set_activation_status
from lifecycle.verification import record_platform_verification
from models.appointments import SnapshotAppointment
from models.ids import fhir_id
from workers.snapshot import build_snapshot, night_window

FHIR_USER_SCOPE = "launch openid fhirUser user/Practitioner.rs"
PATIENT_ONLY_SCOPE = "launch openid fhirUser patient/Patient.rs"
"""What the demo SMART app (and many real ones) asks: `fhirUser`, and no Practitioner scope."""
NIGHT = dt.date(2030, 3, 4)  # a Monday


@pytest.fixture
def fhir_user_world(runtime, world):
    """`world` with an app that declares fhirUser and may read Practitioners (set before `live` starts)."""
    set_smart_scopes(runtime, world.app.id, FHIR_USER_SCOPE)
    return world


def test_fhir_user_resolves_on_a_sandbox_clinic_with_the_launchs_own_token(fhir_user_world, runtime, live):
    world = fhir_user_world
    tokens = launch_tokens(live, runtime, world.physician, world.app, world.secret, FHIR_USER_SCOPE)
    fhir_user = jwt.get_unverified_claims(tokens["id_token"])["fhirUser"]
    assert fhir_user == f"{live}/fhir/r4/{world.org.id}/Practitioner/{fhir_id(world.physician.id)}"  # usr-…
    status, _, practitioner = Fhir(live, world.org.id, tokens["access_token"]).get(fhir_user)
    assert status == 200 and practitioner["resourceType"] == "Practitioner", practitioner
    assert practitioner["identifier"] == [{"system": "http://hl7.org/fhir/sid/us-npi", "value": world.physician.npi}]
    # A user the EHR has no Practitioner for (no NPI) gets no fhirUser rather than a dangling one.
    tokens = launch_tokens(live, runtime, world.staff, world.app, world.secret, FHIR_USER_SCOPE)
    assert tokens["scope"] == "openid launch fhirUser user/Practitioner.rs"
    assert "fhirUser" not in jwt.get_unverified_claims(tokens["id_token"])


@pytest.fixture
def patient_only_world(runtime, world):
    """`world` whose app declares `PATIENT_ONLY_SCOPE`, and a second physician of its clinic (set
    before `live` starts): (world, that physician)."""
    set_smart_scopes(runtime, world.app.id, PATIENT_ONLY_SCOPE)
    other = create_user(world.org.id, "other@fhir-user.example", "Olga", "Other", "oother", "1417000019")
    return world, other


def disclosures(settings, org_id: str, *args: str) -> list[dict]:
    done = cli(settings, "audit", "disclosures", "--org", org_id, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def refused_for_scope(answer) -> bool:
    status, headers, body = answer
    return (status == 403 and outcome(body) == "forbidden"
            and 'error="insufficient_scope"' in headers.get("WWW-Authenticate", ""))


def test_the_fhir_user_scope_alone_reads_the_users_practitioner_on_a_sandbox_clinic(patient_only_world, runtime,
                                                                                     live):
    world, other = patient_only_world
    mine = fhir_id(world.physician.id)
    for prefix in ("/v1", "/os-api/v2"):
        tokens = launch_tokens(live, runtime, world.physician, world.app, world.secret, PATIENT_ONLY_SCOPE, prefix)
        assert tokens["scope"] == "openid launch fhirUser patient/Patient.rs", tokens
        fhir_user = jwt.get_unverified_claims(tokens["id_token"])["fhirUser"]
        assert fhir_user == f"{live}/fhir/r4/{world.org.id}/Practitioner/{mine}"
        fhir = Fhir(live, world.org.id, tokens["access_token"])
        status, _, body = fhir.get(fhir_user)
        assert status == 200 and body["resourceType"] == "Practitioner" and body["id"] == mine, (prefix, body)
    # Nothing else: another Practitioner, a search of Practitioners (even of the user's own), by GET or POST.
    assert refused_for_scope(fhir.get(f"/Practitioner/{fhir_id(other.id)}"))
    assert refused_for_scope(fhir.get("/Practitioner"))
    assert refused_for_scope(fhir.get("/Practitioner", {"_id": mine}))
    assert refused_for_scope(fhir.post_search("Practitioner", {"_id": mine}))
    # A token without `fhirUser` in its scope: today's answer, for the user's own Practitioner too.
    tokens = launch_tokens(live, runtime, world.physician, world.app, world.secret, "launch openid patient/Patient.rs")
    assert "fhirUser" not in tokens["scope"].split() and "fhirUser" not in jwt.get_unverified_claims(tokens["id_token"])
    assert refused_for_scope(Fhir(live, world.org.id, tokens["access_token"]).get(f"/Practitioner/{mine}"))
    # Each read is a disclosure record like any other, the one that succeeded and those refused.
    reads = [r for r in disclosures(runtime.settings, world.org.id, "--user", world.physician.id)
             if r["action"] == "read" and r["resource_type"] == "Practitioner"]
    assert [(r["outcome"], r["status"], r["resource_ids"]) for r in reads] == [
        ("success", 200, [mine]), ("success", 200, [mine]), ("failure", 403, [fhir_id(other.id)]),
        ("failure", 403, [mine])], reads
    assert reads[0]["scope"] == "openid launch fhirUser patient/Patient.rs" and reads[0]["patients"] == []
    assert reads[0]["application_id"] == world.app.id and reads[0]["jti"]


def test_the_chart_schema_is_served_without_a_token_and_is_cacheable(live):
    from helpers.http import http
    status, headers, body = http("GET", f"{live}/v1/schemas/chart.json")
    assert status == 200 and headers["Content-Type"] == "application/schema+json", headers
    assert "max-age=" in headers["Cache-Control"] and headers.get("Etag"), headers
    schema = json.loads(body)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert "omitted" in schema["properties"] and "omitted" not in schema["required"]
    status, _, _ = http("GET", f"{live}/v1/schemas/chart.json", None, {"If-None-Match": headers["Etag"]})
    assert status == 304


@pytest.mark.gen_test(timeout=120)
async def test_a_sandbox_chart_has_the_one_shape_and_its_vitals_are_observations(api, runtime, world):
    validator = await chart_schema_validator(api)
    connector = connector_for(runtime, world.org)
    patient = connector.panel()[5].id
    headers = await partner_headers(api, world.app, world.secret)
    status, _, created = await api.call("POST", "/v1/chart-retrieval/requests",
                                        {"svc_organization_id": world.org.id, "patient_id": patient}, headers=headers)
    assert status == 202, created
    request_id = created["request_id"]
    assert (await wait_until_not_pending(api, headers, request_id))["status"] == "ready"
    _, _, link = await api.call("GET", f"/v1/chart-retrieval/download-url/{request_id}", headers=headers)
    from helpers.charts import fetch_zip
    response = await fetch_zip(api, link["download_url"], runtime)
    text, chart = open_archive(response.body, request_id, world.app.id)
    errors = [error.message for error in validator.iter_errors(chart)]
    assert not errors, errors
    # The vitals are observations, with the ids the sandbox's FHIR API serves; encounters carry none.
    assert chart["encounters"] and all("vitals" not in e for e in chart["encounters"])
    served = {o["id"]: o for o in connector.search_resources(ResourceQuery("Observation", patient=patient, count=1000))}
    assert {o["id"] for o in chart["observations"]} == set(served)
    heart = next(o for o in chart["observations"] if o["code"] == "8867-4")
    assert heart["category"] == "Vital Signs" and heart["unit"] == "/min" and heart["value"].isdigit()
    assert str(served[heart["id"]]["valueQuantity"]["value"]) == heart["value"]
    assert {e["id"] for e in chart["encounters"]} == {
        r["id"] for r in connector.search_resources(ResourceQuery("Encounter", patient=patient, count=1000))}
    flat = text.replace("\n", " ")
    assert f"Heart rate: {heart['value']} /min" in flat and "Vitals:" not in flat  # the PDF follows


@pytest.mark.gen_test(timeout=120)
async def test_every_appointment_status_of_a_sandbox_clinic_is_a_fhir_code(api, runtime, world):
    start = night_window(runtime.settings, NIGHT)[0]
    runtime.clock.offset = 0.0
    runtime.clock.advance((start - dt.timedelta(hours=6) - runtime.clock.now()).total_seconds())
    installation = record_platform_verification(runtime, world.app, world.physician)
    set_activation_status(runtime, installation, "Enabled", "test")  # a Disabled app reads no clinic data
    record_activity(runtime, world.physician)
    snapshot = build_snapshot(runtime, world.org.id, NIGHT)
    headers = await partner_headers(api, world.app, world.secret)
    status, _, page = await api.call("GET", f"/v1/appointments/{world.org.id}?limit=50", headers=headers)
    assert status == 200 and page["total"] > 0, page   # (the OpenAPI contract checks each against its enum too)
    assert {a["status"] for a in page["appointments"]} <= set(APPOINTMENT_STATUSES)
    # What the sandbox's FHIR API serves, and what a snapshot built before statuses were FHIR codes holds.
    connector = connector_for(runtime, world.org)
    served = list(connector.search_resources(ResourceQuery("Appointment", count=1000)))
    assert served and {a["status"] for a in served} <= set(APPOINTMENT_STATUSES)
    (SnapshotAppointment.update(status="confirmed")
     .where(SnapshotAppointment.snapshot == snapshot.id).execute())
    _, _, page = await api.call("GET", f"/v1/appointments/{world.org.id}?limit=5", headers=headers)
    assert [a["status"] for a in page["appointments"]] == ["booked"] * len(page["appointments"])



# -- a FHIR clinic (the Medplum-based test EHR) ---------------------------------------------------

ANA_NPI, BEN_NPI, UNKNOWN_NPI = "1417000043", "1417000019", "1417000050"


def ana_launched_on_a_fhir_clinic(world, runtime, live, fhir_ehr, name: str, scope: str):
    """A FHIR clinic `name` on the test EHR (Practitioners pr-ana and pr-ben), the app installed, Dr.
    Ana (NPI ANA_NPI) launched with `scope`: (clinic id, Ana, tokens, the ID token's `fhirUser`, the
    EHR's Practitioner, not svc-auth's user id)."""
    org_id = connect_clinic(runtime.settings, fhir_ehr, f"{live}/ehr/jwks.json", name=name)
    fhir_ehr.seed(practitioner("pr-ana", ANA_NPI, "Lopez", "Ana"), practitioner("pr-ben", BEN_NPI, "Okafor", "Ben"))
    install_application(world.app.id, org_id)
    ana = create_user(org_id, "ana@fhir-user.example", "Ana", "Lopez", "alopez", ANA_NPI)
    tokens = launch_tokens(live, runtime, ana, world.app, world.secret, scope)
    fhir_user = jwt.get_unverified_claims(tokens["id_token"])["fhirUser"]
    assert fhir_user == f"{live}/fhir/r4/{org_id}/Practitioner/pr-ana"
    return org_id, ana, tokens, fhir_user


@pytest.mark.slow
def test_fhir_user_resolves_on_a_fhir_clinic_to_the_ehrs_practitioner(fhir_user_world, runtime, live, fhir_ehr):
    world = fhir_user_world
    org_id, ana, tokens, fhir_user = ana_launched_on_a_fhir_clinic(world, runtime, live, fhir_ehr, "fhirUser Clinic",
                                                                   FHIR_USER_SCOPE)
    status, _, body = Fhir(live, org_id, tokens["access_token"]).get(fhir_user)
    assert status == 200 and body["resourceType"] == "Practitioner" and body["id"] == "pr-ana", body
    assert {"system": "http://hl7.org/fhir/sid/us-npi", "value": ANA_NPI} in body["identifier"]
    # Cached per process by NPI: another launch asks the EHR nothing; a changed NPI is looked up anew.
    searches = fhir_ehr.stats()["pages"].get("Practitioner", 0)
    launch_tokens(live, runtime, ana, world.app, world.secret, FHIR_USER_SCOPE)
    assert fhir_ehr.stats()["pages"].get("Practitioner", 0) == searches
    update_user(ana.id, npi=BEN_NPI)
    tokens = launch_tokens(live, runtime, ana, world.app, world.secret, FHIR_USER_SCOPE)
    assert jwt.get_unverified_claims(tokens["id_token"])["fhirUser"] == f"{live}/fhir/r4/{org_id}/Practitioner/pr-ben"
    # An NPI the EHR does not know: no fhirUser rather than one that would be a 404.
    zed = create_user(org_id, "zed@fhir-user.example", "Zed", "Unknown", "zunknown", UNKNOWN_NPI)
    tokens = launch_tokens(live, runtime, zed, world.app, world.secret, FHIR_USER_SCOPE)
    assert "fhirUser" in tokens["scope"].split() and "fhirUser" not in jwt.get_unverified_claims(tokens["id_token"])


@pytest.mark.slow
def test_the_fhir_user_scope_alone_reads_the_users_practitioner_on_a_fhir_clinic(patient_only_world, runtime, live,
                                                                                  fhir_ehr):
    world, _ = patient_only_world
    org_id, ana, tokens, fhir_user = ana_launched_on_a_fhir_clinic(world, runtime, live, fhir_ehr,
                                                                   "fhirUser Scope Clinic", PATIENT_ONLY_SCOPE)
    fhir = Fhir(live, org_id, tokens["access_token"])
    status, _, body = fhir.get(fhir_user)                       # read from the EHR, as any read
    assert status == 200 and body["resourceType"] == "Practitioner" and body["id"] == "pr-ana", body
    assert {"system": "http://hl7.org/fhir/sid/us-npi", "value": ANA_NPI} in body["identifier"]
    assert refused_for_scope(fhir.get("/Practitioner/pr-ben"))
    assert refused_for_scope(fhir.get("/Practitioner", {"identifier": ANA_NPI}))
    tokens = launch_tokens(live, runtime, ana, world.app, world.secret, "launch openid patient/Patient.rs")
    assert refused_for_scope(Fhir(live, org_id, tokens["access_token"]).get("/Practitioner/pr-ana"))
    # The EHR no longer grants svc-auth Practitioner: the EHR's refusal, as for any read of it.
    fhir_ehr.register(CLIENT_ID, f"{live}/ehr/jwks.json", grant=["Patient", "Appointment"])
    status, _, body = fhir.get(fhir_user)
    assert status == 403 and outcome(body) == "forbidden", body
    assert "has not granted svc-auth access to Practitioner" in body["issue"][0]["diagnostics"], body
    reads = [(r["outcome"], r["status"], r["resource_ids"]) for r in disclosures(runtime.settings, org_id)
             if r["action"] == "read"]
    assert reads == [("success", 200, ["pr-ana"]), ("failure", 403, ["pr-ben"]), ("failure", 403, ["pr-ana"]),
                     ("failure", 403, ["pr-ana"])], reads
