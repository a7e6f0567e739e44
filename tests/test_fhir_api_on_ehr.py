"""The platform FHIR API (`/fhir/r4/{org}`) for a clinic on a real FHIR EHR (tests/js/fhir_ehr.mjs:
Medplum's FHIR engine behind SMART Backend Services tokens), over HTTP against `svc-auth serve` on
both databases: reads and searches answer what the EHR holds, with the platform's URLs only; a
`patient/` token is held to its patient; the EHR down is a 503, a revoked registration a 502."""
from __future__ import annotations

import datetime as dt
import json

import pytest

from helpers.fhir_api import Fhir, outcome, resources
from helpers.fhir_ehr import CLIENT_ID, appointment, chart_record, connect_clinic, patient, practitioner
from helpers.processes import wait_until
from helpers.tokens import mint_platform_token
from fhir_api.api import RETRY_AFTER_SECONDS
from lifecycle.applications import install_application
from lifecycle.users import create_user

pytestmark = pytest.mark.slow

NPI = "http://hl7.org/fhir/sid/us-npi"
ANA_NPI, BEN_NPI = "1417000043", "1417000019"
MONDAY = dt.datetime(2026, 3, 2, 9, 0)
FOREIGN = "https://other-ehr.example/fhir/R4"
ANA_APPOINTMENTS = 12


def record_of_b(ehr_base: str) -> list[dict]:
    """Patient B's own resources (one of each type), one with an absolute reference to the EHR."""
    ref = {"reference": "Patient/pt-b"}
    return [
        {"resourceType": "Condition", "id": "cond-b", "subject": ref, "onsetDateTime": "2022-05-01",
         "code": {"coding": [{"system": "http://snomed.info/sct", "code": "195967001"}], "text": "Asthma"}},
        {"resourceType": "Observation", "id": "obs-b", "status": "final", "subject": ref,
         "code": {"coding": [{"system": "http://loinc.org", "code": "8867-4"}], "text": "Heart rate"},
         "effectiveDateTime": "2024-03-05T10:00:00Z", "valueQuantity": {"value": 72, "unit": "/min"}},
        {"resourceType": "MedicationRequest", "id": "med-b", "status": "active", "intent": "order", "subject": ref,
         "authoredOn": "2022-05-02", "medicationCodeableConcept": {"text": "Albuterol inhaler"}},
        {"resourceType": "AllergyIntolerance", "id": "alg-b", "patient": ref, "code": {"text": "Peanut"}},
        {"resourceType": "Encounter", "id": "enc-b", "status": "finished", "subject": ref,
         "class": {"code": "AMB"}, "period": {"start": "2024-03-05T09:30:00Z"},
         "participant": [{"individual": {"reference": f"{ehr_base}/Practitioner/pr-ben"}}]},
    ]


def seed(ehr) -> None:
    """A practitioner with each NPI, patients A and B with their records, Ana's appointments
    (hourly from Monday 09:00, alternating A and B) and one of Ben's; an observation of A whose
    subject is an absolute URL of the EHR, and one whose subject is a `pt-a` of another server."""
    ehr.seed(practitioner("pr-ana", ANA_NPI, "Lopez", "Ana"), practitioner("pr-ben", BEN_NPI, "Okafor", "Ben"),
             patient("pt-a", "Doe", "Jane", "1970-01-02", "female"), patient("pt-b", "Roe", "Rick", "1955-06-30", "male"),
             *[appointment(f"ana-{n:02d}", "pr-ana", "pt-a" if n % 2 == 0 else "pt-b", MONDAY + dt.timedelta(hours=n))
               for n in range(ANA_APPOINTMENTS)],
             appointment("ben-1", "pr-ben", "pt-b", MONDAY + dt.timedelta(days=1)),
             *chart_record("pt-a", encounters=3, observations=2), *record_of_b(ehr.base),
             {"resourceType": "Observation", "id": "obs-abs", "status": "final", "code": {"text": "Weight"},
              "subject": {"reference": f"{ehr.base}/Patient/pt-a"}, "effectiveDateTime": "2024-03-06T10:00:00Z",
              "valueQuantity": {"value": 70, "unit": "kg"}},
             {"resourceType": "Observation", "id": "obs-foreign", "status": "final", "code": {"text": "Weight"},
              "subject": {"reference": f"{FOREIGN}/Patient/pt-a"}, "valueQuantity": {"value": 90, "unit": "kg"}})


@pytest.fixture
def fhir_clinic(runtime, world, live, fhir_ehr):
    """The FHIR clinic connected with the CLI and seeded, the app installed, and Ana (a physician
    of the clinic) with a `user/*.rs` token: (org id, Ana, her Fhir client)."""
    org_id = connect_clinic(runtime.settings, fhir_ehr, f"{live}/ehr/jwks.json", name="FHIR API Clinic")
    seed(fhir_ehr)
    install_application(world.app.id, org_id)
    ana = create_user(org_id, "ana@fhir-api.example", "Ana", "Lopez", "alopez", ANA_NPI)
    return org_id, ana, Fhir(live, org_id, mint_platform_token(runtime, live, ana, world.app, org_id))


def no_ehr_url(body, ehr) -> None:
    """Nothing in an answer names the EHR's host: Bundle URLs are the platform's, references relative."""
    text = json.dumps(body)
    assert ehr.origin not in text and f"127.0.0.1:{ehr.port}" not in text, text


def ids(bundle: dict) -> list[str]:
    return [r["id"] for r in resources(bundle)]


def patient_ref(resource: dict) -> str:
    if resource["resourceType"] == "Appointment":
        return next(p["actor"]["reference"] for p in resource["participant"]
                    if p["actor"]["reference"].startswith("Patient/"))
    return (resource.get("subject") or resource.get("patient"))["reference"]


def test_reads_and_searches_answer_what_the_ehr_holds_with_the_platforms_urls(fhir_clinic, fhir_ehr):
    _, _, fhir = fhir_clinic
    # Reads: each type by id, the fields that matter as the EHR holds them.
    held = {("Patient", "pt-a"): None, ("Practitioner", "pr-ana"): None, ("Appointment", "ana-01"): "Patient/pt-b",
            ("Encounter", "enc-000"): "Patient/pt-a", ("Condition", "cond-htn"): "Patient/pt-a",
            ("Observation", "obs-a1c"): "Patient/pt-a", ("MedicationRequest", "med-b"): "Patient/pt-b",
            ("AllergyIntolerance", "alg-1"): "Patient/pt-a"}
    for (kind, ident), subject in held.items():
        resource = fhir.ok(f"/{kind}/{ident}")
        assert resource["resourceType"] == kind and resource["id"] == ident
        if subject:
            assert patient_ref(resource) == subject
        no_ehr_url(resource, fhir_ehr)
    assert fhir.ok("/Practitioner/pr-ana")["identifier"] == [{"system": NPI, "value": ANA_NPI}]
    assert fhir.ok("/Observation/obs-a1c")["valueQuantity"] == {"value": 7.1, "unit": "%"}
    assert fhir.ok("/Patient/pt-b")["birthDate"] == "1955-06-30"

    # The EHR's absolute references come out relative to the platform's base.
    assert fhir.ok("/Observation/obs-abs")["subject"] == {"reference": "Patient/pt-a"}
    assert fhir.ok("/Encounter/enc-b")["participant"][0]["individual"] == {"reference": "Practitioner/pr-ben"}
    # Another server's reference is removed (docs/fhir-api.md, "References"): never a URL to a host we did not choose.
    assert fhir.ok("/Observation/obs-foreign")["subject"] == {"display": "A reference outside the clinic's EHR (removed)"}

    # Unknown ids (and an id of another type): 404 OperationOutcomes.
    for path in ("/Patient/pt-zzz", "/Observation/pt-a", "/Appointment/nope"):
        status, _, body = fhir.get(path)
        assert status == 404 and outcome(body) == "not-found", (path, body)
        no_ehr_url(body, fhir_ehr)

    # Searches by patient: exactly the EHR's compartment of the patient, for each type.
    compartment = fhir_ehr.compartment("pt-a")
    for kind in ("Condition", "Observation", "MedicationRequest", "AllergyIntolerance", "Encounter", "Appointment"):
        bundle = fhir.search(kind, {"patient": "pt-a", "_count": 100})
        assert sorted(ids(bundle)) == sorted(compartment[kind]) and bundle["total"] == len(compartment[kind]), kind
        assert {patient_ref(r) for r in resources(bundle)} == {"Patient/pt-a"}, kind
        no_ehr_url(bundle, fhir_ehr)
    assert sorted(ids(fhir.search("Condition", {"subject": f"{fhir.base}/Patient/pt-b"}))) == ["cond-b"]
    assert ids(fhir.search("Patient", {"_id": "pt-b"})) == ["pt-b"]

    # By practitioner (Appointment), by date window, by NPI (Practitioner).
    anas = fhir.search("Appointment", {"practitioner": "Practitioner/pr-ana", "_count": 100})
    assert sorted(ids(anas)) == [f"ana-{n:02d}" for n in range(ANA_APPOINTMENTS)]
    assert ids(fhir.search("Appointment", {"actor": "Practitioner/pr-ben"})) == ["ben-1"]
    window = fhir.search("Appointment", [("practitioner", "pr-ana"), ("date", "ge2026-03-02T11:00:00Z"),
                                         ("date", "lt2026-03-02T14:00:00Z")])
    assert sorted(ids(window)) == ["ana-02", "ana-03", "ana-04"]
    assert ids(fhir.search("Appointment", {"date": "2026-03-03"})) == ["ben-1"]
    assert sorted(ids(fhir.search("Observation", {"patient": "pt-a", "date": "2024-03-01"}))) == ["obs-bp"]
    assert sorted(ids(fhir.search("Condition", {"patient": "pt-a", "onset-date": "ge2020"}))) == ["cond-dm"]
    by_npi = fhir.search("Practitioner", {"identifier": f"{NPI}|{BEN_NPI}"})
    assert ids(by_npi) == ["pr-ben"] and by_npi["total"] == 1
    assert ids(fhir.search("Practitioner", {"identifier": ANA_NPI})) == ["pr-ana"]
    assert fhir.search("Practitioner", {"identifier": "1417000000"})["total"] == 0

    # Paging: next links on the platform's base, to the end, each appointment once.
    bundle = fhir.search("Appointment", {"practitioner": "pr-ana", "_count": 5})
    assert bundle["total"] == ANA_APPOINTMENTS
    seen, pages = [], 0
    while True:
        no_ehr_url(bundle, fhir_ehr)
        assert all(e["fullUrl"] == f"{fhir.base}/Appointment/{e['resource']['id']}" for e in bundle["entry"])
        assert bundle["link"][0] == {"relation": "self", "url": bundle["link"][0]["url"]}
        assert bundle["link"][0]["url"].startswith(fhir.base + "/Appointment?")
        seen += ids(bundle)
        pages += 1
        following = [link["url"] for link in bundle["link"] if link["relation"] == "next"]
        if not following:
            break
        assert following[0].startswith(fhir.base + "/Appointment?")
        bundle = fhir.ok(following[0])
    assert pages == 3 and sorted(seen) == [f"ana-{n:02d}" for n in range(ANA_APPOINTMENTS)] and len(set(seen)) == 12


def test_a_patient_scoped_token_reads_only_its_patient_on_the_ehr(fhir_clinic, runtime, world, live, fhir_ehr):
    org_id, ana, _ = fhir_clinic
    fhir = Fhir(live, org_id, mint_platform_token(runtime, live, ana, world.app, org_id,
                                   scope="openid launch/patient patient/*.rs", patient="pt-a"))
    assert fhir.ok("/Patient/pt-a")["id"] == "pt-a"
    assert fhir.ok("/Observation/obs-abs")["subject"] == {"reference": "Patient/pt-a"}
    # Nothing of patient B (nor another server's `Patient/pt-a`): each is a 404, as an unknown id is.
    for path in ("/Patient/pt-b", "/Condition/cond-b", "/Observation/obs-b", "/MedicationRequest/med-b",
                 "/AllergyIntolerance/alg-b", "/Encounter/enc-b", "/Appointment/ana-01", "/Appointment/ben-1",
                 "/Condition/cond-other", "/Patient/someone-else", "/Observation/obs-foreign"):
        status, _, body = fhir.get(path)
        assert status == 404 and outcome(body) == "not-found", (path, body)
    # Searches narrowed to A: without a patient, with A, and with B (nothing).
    compartment = fhir_ehr.compartment("pt-a")
    for kind in ("Condition", "Observation", "MedicationRequest", "AllergyIntolerance", "Encounter", "Appointment"):
        mine = fhir.search(kind, {"_count": 100})
        assert sorted(ids(mine)) == sorted(compartment[kind]), kind
        assert {patient_ref(r) for r in resources(mine)} == {"Patient/pt-a"}, kind
        assert fhir.search(kind, {"patient": "pt-b"})["total"] == 0, kind
    assert ids(fhir.search("Patient")) == ["pt-a"]
    assert fhir.search("Patient", {"_id": "pt-b"})["total"] == 0
    assert sorted(ids(fhir.search("Appointment", {"practitioner": "pr-ana", "_count": 100}))) \
        == [f"ana-{n:02d}" for n in range(0, ANA_APPOINTMENTS, 2)]
    assert fhir.search("Appointment", {"practitioner": "pr-ben"})["total"] == 0   # Ben's is B's
    # Practitioners are the clinic's directory: all of them.
    assert sorted(ids(fhir.search("Practitioner"))) == ["pr-ana", "pr-ben"]


def test_a_comma_ors_patients_on_the_ehr_and_a_patient_token_keeps_its_own(fhir_clinic, runtime, world, live,
                                                                            fhir_ehr):
    """`patient=A,B` (docs/fhir-api.md: a comma ORs values of any parameter) was a 400; the EHR is
    asked R4's `patient=Patient/A,Patient/B`. A `patient/` token naming others as well gets its own."""
    org_id, ana, fhir = fhir_clinic
    a, b = fhir_ehr.compartment("pt-a"), fhir_ehr.compartment("pt-b")
    for kind in ("Condition", "Observation", "Appointment"):
        both = fhir.search(kind, {"patient": "pt-a,Patient/pt-b", "_count": 100})
        assert sorted(ids(both)) == sorted(a[kind] + b[kind]) and both["total"] == len(a[kind]) + len(b[kind]), kind
    assert sorted(ids(fhir.search("Appointment", {"actor": "Patient/pt-b,Practitioner/pr-ben"}))) == sorted(
        b["Appointment"])
    mine = Fhir(live, org_id, mint_platform_token(runtime, live, ana, world.app, org_id,
                                                  scope="openid launch/patient patient/*.rs", patient="pt-a"))
    assert sorted(ids(mine.search("Condition", {"patient": "pt-b,pt-a", "_count": 100}))) == sorted(a["Condition"])
    assert mine.search("Condition", {"patient": "pt-b,pt-zzz"})["total"] == 0


def test_a_next_link_of_a_search_with_long_values_is_followed(fhir_clinic, fhir_ehr):
    """A page ending inside an EHR page: its `next` link's `_cursor` holds that EHR page's URL, every
    search value in it percent-encoded (a non-ASCII character as 6 to 12 characters). Values within
    the API's own limits (512 characters) made cursors past the 4,096 characters `_cursor` was
    allowed: following the Bundle's own `next` link was a 400, so the search could not be paged."""
    _, _, fhir = fhir_clinic
    filler = ",".join(["\u4e00" * 100] * 5)  # 504 characters, OR'd: matches no name
    first = fhir.search("Patient", {"name": f"j,r,{filler}", "_count": 1})
    following = [link["url"] for link in first["link"] if link["relation"] == "next"]
    assert ids(first) == ["pt-a"] and len(following) == 1 and len(following[0]) > 8000
    status, _, second = fhir.get(following[0])
    assert status == 200 and ids(second) == ["pt-b"], second
    assert not [link for link in second["link"] if link["relation"] == "next"]
    no_ehr_url(second, fhir_ehr)


def test_an_ehr_answering_404_to_a_search_is_a_502_never_a_500(fhir_clinic, fhir_ehr):
    """An EHR that answers a search 404 (it serves no such search) is refusing svc-auth's request:
    the app gets 502 `exception`, as for any refusal, never a 500; a read's 404 stays the app's 404."""
    _, _, fhir = fhir_clinic
    assert fhir.ok("/Patient/pt-a")["id"] == "pt-a"
    fhir_ehr.fault(404, count=1000)
    try:
        for path in ("/Practitioner?identifier=" + ANA_NPI, "/Condition?patient=pt-a", "/Appointment"):
            status, _, body = fhir.get(path)
            assert status == 502 and outcome(body) == "exception", (path, status, body)
            no_ehr_url(body, fhir_ehr)
        status, _, body = fhir.get("/Observation/ob-missing")
        assert status == 404 and outcome(body) == "not-found", body
    finally:
        fhir_ehr.fault(404, count=0)
    assert fhir.ok("/Patient/pt-a")["id"] == "pt-a"


def test_the_ehr_down_is_a_503_and_a_revoked_registration_a_502(fhir_clinic, fhir_ehr, tmp_path):
    org_id, _, fhir = fhir_clinic
    assert fhir.ok("/Patient/pt-a")["id"] == "pt-a"
    assert fhir.get("/metadata")[0] == 200                   # what the EHR offers svc-auth, kept for the clinic
    fhir_ehr.fault(503, count=1000, retry_after=0)
    try:
        for path in ("/Patient/pt-a", "/Condition?patient=pt-a"):
            status, headers, body = fhir.get(path)
            assert status == 503 and headers["Retry-After"] == str(RETRY_AFTER_SECONDS) and outcome(body) == "transient", body
            no_ehr_url(body, fhir_ehr)
        status, headers, body = fhir.get("/Appointment")
        assert status == 503 and headers["Retry-After"] == str(RETRY_AFTER_SECONDS)
    finally:
        fhir_ehr.fault(503, count=0)
    assert fhir.ok("/Patient/pt-a")["id"] == "pt-a"          # back when the EHR is

    # A revoked registration: the EHR refuses svc-auth itself, a permanent failure: 502.
    fhir_ehr.revoke()
    for path in ("/Patient/pt-a", "/Observation?patient=pt-a", "/Practitioner?identifier=" + ANA_NPI):
        status, headers, body = fhir.get(path)
        assert status == 502 and outcome(body) == "exception", (path, body)
        assert "Retry-After" not in headers
        diagnostics = body["issue"][0]["diagnostics"]
        assert "refused svc-auth" in diagnostics and "administrator" in diagnostics, diagnostics
        assert "Traceback" not in diagnostics and CLIENT_ID not in diagnostics
        no_ehr_url(body, fhir_ehr)
    # The operator's words (what to fix) are in the service's log, with no traceback.
    log = tmp_path / "serve.log"
    logged = wait_until(lambda: [line for line in log.read_text().splitlines() if "failed for good" in line],
                        what="the refusal logged")
    assert org_id in logged[0] and CLIENT_ID in logged[0] and "/ehr/jwks.json" in logged[0], logged
    assert "Traceback" not in log.read_text()
    assert fhir.get("/metadata")[0] == 200                   # the kept one: no EHR call
    fhir_ehr.register(CLIENT_ID, f"{fhir.base.split('/fhir/')[0]}/ehr/jwks.json")
    assert fhir.ok("/Patient/pt-a")["id"] == "pt-a"          # registered again: served again


def test_a_searchset_whose_entry_or_link_is_no_list_is_a_502_never_a_500(fhir_clinic, fhir_ehr):
    """A searchset Bundle whose `entry` or `link` is a number or `true` (no FHIR server sends one; a
    broken or hostile EHR may): iterating it raised TypeError, a 500 for the app (and an unexpected
    error failing the clinic's night). It is the EHR's error: 502 `exception`, as any malformed answer."""
    _, _, fhir = fhir_clinic
    fhir_ehr.reshape({"searchset/Condition": {"entry": 5}, "searchset/Practitioner": {"link": True}})
    try:
        for path in ("/Condition?patient=pt-a", "/Practitioner?identifier=" + ANA_NPI):
            status, _, body = fhir.get(path)
            assert status == 502 and outcome(body) == "exception", (path, status, body)
            no_ehr_url(body, fhir_ehr)
    finally:
        fhir_ehr.reshape({})
    assert ids(fhir.search("Condition", {"patient": "pt-a"}))
