"""FHIR clients against the platform FHIR API through a real `svc-auth serve` process: SMART Health
IT's Python `fhirclient` (its strict R4 models parse every answer) reads the CapabilityStatement,
finds the SMART OAuth endpoints in it, and reads and searches with a launch's access token; and
the JS SDK's published build (`instance.fhir`) does the same from Node."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from fhirclient import client
from fhirclient.models.appointment import Appointment
from fhirclient.models.condition import Condition
from fhirclient.models.encounter import Encounter
from fhirclient.models.observation import Observation
from fhirclient.models.patient import Patient
from fhirclient.models.practitioner import Practitioner
from fhirclient.server import FHIRNotFoundException, FHIRPermissionDeniedException

from helpers.environment import JS_DIR
from helpers.fhir_api import Fhir, resources
from helpers.tokens import mint_platform_token
from models.ids import fhir_id


def smart_client(live, world, token, patient_id=None):
    smart = client.FHIRClient(settings={"app_id": world.app.client_id, "api_base": f"{live}/fhir/r4/{world.org.id}",
                                        "patient_id": patient_id})
    smart.prepare()  # reads and parses {iss}/metadata
    assert smart.server.auth.auth_type == "oauth2"
    assert smart.server.auth._authorize_uri == f"{live}/v1/oauth/authorize"
    assert smart.server.auth._token_uri == f"{live}/v1/oauth/token"
    smart.server.auth.access_token = token
    assert smart.ready
    return smart


def test_fhirclient_reads_and_searches_with_a_user_token(live, runtime, world):
    token = mint_platform_token(runtime, live, world.physician, world.app, world.org.id, scope="openid fhirUser user/*.rs")
    smart = smart_client(live, world, token)
    statement = smart.server.capabilityStatement
    assert statement.fhirVersion == "4.0.1" and statement.rest[0].security.service[0].coding[0].code == "SMART-on-FHIR"
    practitioner = Practitioner.read(world.physician.id, smart.server)
    assert practitioner.identifier[0].system == "http://hl7.org/fhir/sid/us-npi"
    assert practitioner.identifier[0].value == world.physician.npi
    found = Practitioner.where(struct={"identifier": f"http://hl7.org/fhir/sid/us-npi|{world.physician.npi}"}) \
        .perform_resources(smart.server)
    assert [p.id for p in found] == [fhir_id(world.physician.id)]  # R4 spelling: usr-…
    appointments = Appointment.where(struct={"practitioner": world.physician.id, "_count": "20"}) \
        .perform_resources(smart.server)
    assert appointments and all(a.status == "booked" for a in appointments)
    patient_id = next(p.actor.reference for p in appointments[0].participant
                      if p.actor.reference and p.actor.reference.startswith("Patient/")).split("/")[1]
    patient = Patient.read(patient_id, smart.server)
    assert patient.id == patient_id and patient.name[0].family and patient.birthDate.date
    # Every page, through the Bundle's next links.
    encounters = list(Encounter.where(struct={"patient": patient_id, "_count": "5"}).perform_resources_iter(smart.server))
    total = Fhir(live, world.org.id, token).search("Encounter", {"patient": patient_id})["total"]
    assert len(encounters) == total and len({e.id for e in encounters}) == total
    vitals = Observation.where(struct={"subject": f"Patient/{patient_id}", "_count": "100"}).perform_resources(smart.server)
    assert {o.code.coding[0].code for o in vitals} == {"85354-9", "8867-4", "8310-5", "29463-7"}
    with pytest.raises(FHIRNotFoundException):
        Patient.read("pat_0000000000000000", smart.server)


def test_fhirclient_with_a_patient_launch_token(live, runtime, world):
    user_token = mint_platform_token(runtime, live, world.physician, world.app, world.org.id)
    mine, other = [r["id"] for r in resources(Fhir(live, world.org.id, user_token).search("Patient", {"_count": 2}))]
    token = mint_platform_token(runtime, live, world.physician, world.app, world.org.id, scope="openid launch/patient patient/*.rs",
                 patient=mine)
    smart = smart_client(live, world, token, patient_id=mine)
    assert smart.patient.id == mine  # fhirclient reads the launch patient itself
    conditions = Condition.where(struct={"patient": mine}).perform_resources(smart.server)
    assert conditions and {c.subject.reference for c in conditions} == {f"Patient/{mine}"}
    with pytest.raises(FHIRNotFoundException):
        Patient.read(other, smart.server)
    narrow = smart_client(live, world, mint_platform_token(runtime, live, world.physician, world.app, world.org.id,
                                            scope="openid patient/Patient.rs", patient=mine), patient_id=mine)
    with pytest.raises(FHIRPermissionDeniedException):
        Appointment.where(struct={"patient": mine}).perform_resources(narrow.server)


def test_the_js_sdk_build_reads_and_searches_the_live_api(live, runtime, world):
    """sdk/js/dist/svc-sdk.mjs, as a partner's code loads it: `instance.fhir` against the service."""
    node = shutil.which("node")
    assert node, "node is required (make test installs it)"
    user_fhir = Fhir(live, world.org.id, mint_platform_token(runtime, live, world.physician, world.app, world.org.id))
    mine, other = [r["id"] for r in resources(user_fhir.search("Patient", {"_count": 2}))]
    token = mint_platform_token(runtime, live, world.physician, world.app, world.org.id, scope="openid launch/patient patient/*.rs",
                 patient=mine)
    calls = [["read", "Patient", mine], ["search", "Condition", {"patient": mine, "_count": 5}],
             ["read", "Patient", other], ["search", "Practitioner", {"identifier": "x|y|"}]]
    result = subprocess.run([node, str(JS_DIR / "sdk_fhir.mjs"), json.dumps(
        {"platform": live, "accessToken": token, "calls": calls})], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["baseUrl"] == f"{live}/fhir/r4/{world.org.id}"  # from the token's org: no iss given
    patient, conditions, refused, bad = answer["results"]
    assert patient["ok"] and patient["value"]["id"] == mine
    assert conditions["ok"] and conditions["value"]["type"] == "searchset"
    assert {e["resource"]["subject"]["reference"] for e in conditions["value"]["entry"]} == {f"Patient/{mine}"}
    assert not refused["ok"] and refused["status"] == 404 and refused["code"] == "not-found"
    assert refused["body"]["resourceType"] == "OperationOutcome"
    assert not bad["ok"] and bad["status"] == 400 and bad["code"] == "invalid"
