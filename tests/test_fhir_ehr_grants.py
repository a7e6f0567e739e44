"""A FHIR clinic's EHR grants what its registration of svc-auth says (issue 46), through HTTP against
`svc-auth serve` and the test EHR (tests/js/fhir_ehr.mjs: Medplum's FHIR engine behind
node-oidc-provider, checking every request against its token's scopes):

- svc-auth asks a `system/` scope for every type it serves; an EHR that grants them all serves
  every type, `_include` and `_revinclude`;
- an EHR that grants only the nine types of the night and the charts: those work as before, the
  others answer 403 `forbidden` (never a 502, never asked of the EHR), an `_include`/`_revinclude`
  of them becomes an OperationOutcome entry, the clinic's CapabilityStatement leaves them out,
  `ehr check` names them;
- POST `_search` answers as GET, on both kinds of clinic, and is recorded alike;
- paging through the EHR's own position reaches the end of 3,000 matches on an EHR paging by 50.
"""
from __future__ import annotations

import base64
import json
import time
import urllib.parse

import pytest

from helpers.fhir_api import Fhir, outcome, resources
from helpers.fhir_ehr import CLIENT_ID, chart_record, cli, connect_clinic, patient, practitioner
from helpers.r4 import r4_invalid
from helpers.tokens import mint_platform_token
from connectors.sandbox import patient_panel
from lifecycle.applications import install_application, set_fhir_rate_limits
from lifecycle.users import create_user
from models.directory import User
from models.ids import fhir_id
from ratelimit.policy import Limit

pytestmark = pytest.mark.slow

NINE = ["Practitioner", "Appointment", "Patient", "Encounter", "Condition", "Observation", "MedicationRequest",
        "AllergyIntolerance", "DocumentReference"]
ANA_NPI = "1417000043"


def record() -> list[dict]:
    """Patient A's chart, a care plan, a Medication ordered by reference, a Provenance of a condition."""
    ref = {"reference": "Patient/pt-a"}
    return [practitioner("pr-ana", ANA_NPI, "Lopez", "Ana"), patient("pt-a", "Doe", "Jane", "1970-01-02", "female"),
            *chart_record("pt-a", encounters=1, observations=2),
            {"resourceType": "CarePlan", "id": "cp-a", "status": "active", "intent": "plan", "subject": ref,
             "category": [{"coding": [{"system": "http://hl7.org/fhir/us/core/CodeSystem/careplan-category",
                                       "code": "assess-plan"}]}]},
            {"resourceType": "Medication", "id": "medication-1", "code": {"text": "Lisinopril 10 mg tablet"}},
            {"resourceType": "MedicationRequest", "id": "med-ref", "status": "active", "intent": "order",
             "subject": ref, "medicationReference": {"reference": "Medication/medication-1"}},
            {"resourceType": "Provenance", "id": "prov-htn", "target": [{"reference": "Condition/cond-htn"}],
             "recorded": "2024-01-01T00:00:00Z",
             "agent": [{"who": {"reference": "Practitioner/pr-ana"}}]}]


@pytest.fixture
def grants_clinic(runtime, world, live, fhir_ehr):
    """The FHIR clinic, seeded, the app installed, and Ana's `user/*.rs` token: (org id, Fhir)."""
    set_fhir_rate_limits(runtime, world.app.id, fhir_rate_limit=Limit(100000, 60),
                         fhir_token_rate_limit=Limit(100000, 60))
    org_id = connect_clinic(runtime.settings, fhir_ehr, f"{live}/ehr/jwks.json", name="Grants Clinic")
    fhir_ehr.seed(*record())
    install_application(world.app.id, org_id)
    ana = create_user(org_id, "ana@grants.example", "Ana", "Lopez", "alopez", ANA_NPI)
    return org_id, Fhir(live, org_id, mint_platform_token(runtime, live, ana, world.app, org_id))


def by_mode(bundle: dict, mode: str) -> list[dict]:
    return [e["resource"] for e in bundle.get("entry", ()) if e["search"]["mode"] == mode]


def listed(metadata: dict) -> dict:
    return {r["type"]: r for r in metadata["rest"][0]["resource"]}


def ehr_check(settings, org_id) -> tuple[int, dict]:
    done = cli(settings, "ehr", "check", "--org", org_id, "--json")
    return done.returncode, json.loads(done.stdout)


def test_an_ehr_granting_everything_then_only_the_nine_types(grants_clinic, fhir_ehr, runtime, live):
    org_id, fhir = grants_clinic
    served = []

    # Everything granted: every type, the include and the revinclude.
    code, verdict = ehr_check(runtime.settings, org_id)
    scopes = next(s for s in verdict["steps"] if s["step"] == "scopes")
    assert code == 0 and verdict["ok"] and scopes["ok"] and scopes["missing"] == [], verdict
    assert {"CarePlan", "Provenance", "Medication", "FamilyMemberHistory", "Specimen"} <= set(scopes["granted"])
    assert [r["id"] for r in resources(fhir.search("CarePlan", {"patient": "pt-a"}))] == ["cp-a"]
    bundle = fhir.search("Condition", {"patient": "pt-a", "_revinclude": "Provenance:target"})
    assert [r["id"] for r in by_mode(bundle, "include")] == ["prov-htn"] and not by_mode(bundle, "outcome")
    bundle = fhir.search("MedicationRequest", {"patient": "pt-a", "_include": "MedicationRequest:medication"})
    assert [r["id"] for r in by_mode(bundle, "include")] == ["medication-1"]
    metadata = fhir.ok("/metadata")
    assert {"CarePlan", "Provenance", "Medication", "Condition"} <= set(listed(metadata))
    assert listed(metadata)["Condition"]["searchRevInclude"] == ["Provenance:target"]
    served += [bundle, metadata]

    # The EHR now grants svc-auth only the nine types of the night and the charts.
    fhir_ehr.register(CLIENT_ID, f"{live}/ehr/jwks.json", grant=NINE)
    status, _, body = fhir.get("/CarePlan", {"patient": "pt-a"})  # svc-auth's token is renewed: no longer CarePlan
    assert status == 403 and outcome(body) == "forbidden", body
    before = fhir_ehr.stats()["fhir"]
    for path in ("/CarePlan?patient=pt-a", "/CarePlan/cp-a", "/Provenance?patient=pt-a", "/Medication/medication-1"):
        status, headers, body = fhir.get(path)
        assert status == 403 and outcome(body) == "forbidden", (path, body)
        kind = path.split("/")[1].split("?")[0]
        assert f"has not granted svc-auth access to {kind}" in body["issue"][0]["diagnostics"], body
        assert "Retry-After" not in headers
        served.append(body)
    assert fhir_ehr.stats()["fhir"] == before                # never asked of the EHR

    # The nine work as before; an include or revinclude of an ungranted type is an outcome entry.
    bundle = fhir.search("Condition", {"patient": "pt-a", "_revinclude": "Provenance:target"})
    assert sorted(r["id"] for r in by_mode(bundle, "match")) == ["cond-dm", "cond-htn"]
    assert by_mode(bundle, "include") == []
    (said,) = by_mode(bundle, "outcome")
    assert said["resourceType"] == "OperationOutcome" and said["issue"][0]["code"] == "forbidden"
    assert "_revinclude=Provenance:target" in said["issue"][0]["diagnostics"]
    served.append(bundle)
    bundle = fhir.search("MedicationRequest", {"patient": "pt-a", "_include": "MedicationRequest:medication"})
    assert "med-ref" in [r["id"] for r in by_mode(bundle, "match")] and by_mode(bundle, "include") == []
    assert "Medication" in by_mode(bundle, "outcome")[0]["issue"][0]["diagnostics"]
    served.append(bundle)
    assert [r["id"] for r in resources(fhir.search("Observation", {"patient": "pt-a", "code": "4548-4"}))] == ["obs-a1c"]

    # `ehr check` names what is missing (and passes: the schedule and the charts have what they
    # need); it refreshes the clinic's CapabilityStatement, which leaves the missing types out.
    code, verdict = ehr_check(runtime.settings, org_id)
    scopes = next(s for s in verdict["steps"] if s["step"] == "scopes")
    assert code == 0 and verdict["ok"], verdict
    assert [s["step"] for s in verdict["steps"]] == ["discovery", "token", "scopes", "practitioner", "appointments"]
    assert sorted(scopes["granted"]) == sorted(NINE) and "CarePlan" in scopes["missing"]
    assert "CarePlan" in scopes["detail"] and "Provenance" in scopes["detail"]
    metadata = fhir.ok("/metadata")
    assert set(listed(metadata)) == set(NINE)
    assert "searchRevInclude" not in listed(metadata)["Condition"]
    assert "searchInclude" not in listed(metadata)["MedicationRequest"]
    served.append(metadata)

    # The audit holds the refusals as failures, with the patient asked for.
    rows = json.loads(cli(runtime.settings, "audit", "disclosures", "--org", org_id, "--json").stdout)
    refused = [r for r in rows if r["resource_type"] == "CarePlan" and r["status"] == 403]
    assert refused and refused[-1]["outcome"] == "failure" and "pt-a" in refused[0]["patients"]
    assert r4_invalid(served) == []


def test_a_revinclude_under_a_patient_grant_of_its_type_names_no_other_patients_resource(grants_clinic, runtime,
                                                                                         world, live):
    """A token with `user/Condition.rs` but only `patient/Provenance.rs` (patient B) searching A's
    Conditions: A's Provenance (its only target A's Condition) is outside B's compartment, as its
    own search says; `_revinclude` left it out only when the page itself was B's, and served it."""
    org_id, _ = grants_clinic
    ana = User.get(User.organization == org_id)

    def mixed(patient: str) -> Fhir:
        return Fhir(live, org_id, mint_platform_token(runtime, live, ana, world.app, org_id, patient=patient,
                                                      scope="openid launch/patient user/Condition.rs "
                                                            "patient/Provenance.rs"))
    as_b, as_a = mixed("pt-b"), mixed("pt-a")
    assert as_b.search("Provenance", {"_id": "prov-htn"})["total"] == 0
    bundle = as_b.search("Condition", {"patient": "pt-a", "_revinclude": "Provenance:target"})
    assert sorted(r["id"] for r in by_mode(bundle, "match")) == ["cond-dm", "cond-htn"]
    assert by_mode(bundle, "include") == []
    # A's own: the Provenance of a Condition on the page that A's grant reaches.
    bundle = as_a.search("Condition", {"patient": "pt-a", "_revinclude": "Provenance:target"})
    assert [r["id"] for r in by_mode(bundle, "include")] == ["prov-htn"]


def test_an_ehr_statement_narrows_the_clinics(grants_clinic, fhir_ehr, runtime):
    """A type or search parameter the EHR's own CapabilityStatement does not list is not claimed."""
    org_id, fhir = grants_clinic
    fhir_ehr.statement(hide=["Goal"], params={"Observation": ["patient", "code"]})
    code, _ = ehr_check(runtime.settings, org_id)
    assert code == 0
    metadata = fhir.ok("/metadata")
    kinds = listed(metadata)
    assert "Goal" not in kinds and "CarePlan" in kinds
    assert {p["name"] for p in kinds["Observation"]["searchParam"]} == {"_id", "patient", "code"}
    assert {"category", "code", "onset-date"} <= {p["name"] for p in kinds["Condition"]["searchParam"]}
    assert r4_invalid([metadata]) == []


@pytest.fixture(params=["sandbox", "fhir"])
def either_clinic(request, runtime, world, live):
    """(org id, Fhir, a patient id, a code of one of its observations) on either kind of clinic."""
    set_fhir_rate_limits(runtime, world.app.id, fhir_rate_limit=Limit(100000, 60),
                         fhir_token_rate_limit=Limit(100000, 60))
    if request.param == "sandbox":
        fhir = Fhir(live, world.org.id, mint_platform_token(runtime, live, world.physician, world.app, world.org.id))
        for one in patient_panel(world.org.id):
            found = resources(fhir.search("Observation", {"patient": fhir_id(one.id), "_count": 1}))
            if found:
                return world.org.id, fhir, fhir_id(one.id), found[0]["code"]["coding"][0]["code"]
    org_id, fhir = request.getfixturevalue("grants_clinic")
    return org_id, fhir, "pt-a", "4548-4"


def test_post_search_answers_and_is_recorded_as_get(either_clinic, runtime):
    org_id, fhir, patient_id, code = either_clinic
    params = [("patient", patient_id), ("code", code), ("_count", "5")]
    got = fhir.search("Observation", params)
    status, headers, posted = fhir.post_search("Observation", params)
    assert status == 200 and headers["Content-Type"].startswith("application/fhir+json"), posted
    assert posted == got and resources(posted)
    assert int(headers["RateLimit-Remaining"]) >= 0                   # counted like a GET
    # The query and the form together, as FHIR R4 says.
    status, _, split = fhir.post_search("Observation", [("code", code)], query=f"patient={patient_id}&_count=5")
    assert status == 200 and [r["id"] for r in resources(split)] == [r["id"] for r in resources(got)]
    # Bad input: a 4xx OperationOutcome, as GET's.
    status, _, body = fhir.post_search("Observation", {"patient": patient_id, "date": "yesterday"})
    assert status == 400 and outcome(body) == "invalid"
    status, _, body = fhir.post_search("Observation", b'{"patient": "x"}', content_type="application/json")
    assert status == 415 and outcome(body) == "not-supported"
    status, _, body = fhir.get("/Observation/_search", {"patient": patient_id})
    assert status == 405 and outcome(body) == "not-supported"

    rows = json.loads(cli(runtime.settings, "audit", "disclosures", "--org", org_id, "--json").stdout)
    asked = {"patient": [patient_id], "code": [code], "_count": ["5"]}
    searches = [r for r in rows if r["action"] == "search" and r["resource_type"] == "Observation"
                and urllib.parse.parse_qs(r["query"]) == asked]
    get_row, post_row, split_row = searches                       # the GET, the POST, the query and form
    for field in ("outcome", "status", "patients", "resource_ids", "query", "resource_type"):
        assert get_row[field] == post_row[field], field
    assert split_row["resource_ids"] == get_row["resource_ids"] and split_row["patients"] == get_row["patients"]
    assert post_row["request_id"] != get_row["request_id"]
    assert r4_invalid([got, posted]) == []


def test_paging_through_the_ehrs_own_position_reaches_the_end(grants_clinic, fhir_ehr, runtime, world, live):
    """3,000 observations on an EHR that pages by 50: the API's `next` links reach the last one, each
    match once, each page reading only the EHR pages it needs (and at most 2 more for `total`).
    (The clinic's whole Observation search, as a `user/` token may: Medplum's in-memory engine takes
    seconds per page to filter 3,000 resources by patient, milliseconds to page through them.)"""
    org_id, fhir = grants_clinic
    many = [{"resourceType": "Observation", "id": f"hr-{n:04d}", "status": "final", "subject": {"reference": "Patient/pt-b"},
             "code": {"coding": [{"system": "http://loinc.org", "code": "8867-4"}]},
             "effectiveDateTime": f"2024-01-01T00:00:{n % 60:02d}Z", "valueQuantity": {"value": 60 + n % 40, "unit": "/min"}}
            for n in range(3000)]
    fhir_ehr.seed(patient("pt-b", "Roe", "Rick", "1955-06-30", "male"), *many)
    fhir_ehr.page_by(50)

    seen, pages, requests = [], 0, []
    expected = {r["id"] for r in many} | {r["id"] for r in record() if r["resourceType"] == "Observation"}
    bundle = fhir.search("Observation", {})
    while True:
        seen += [r["id"] for r in resources(bundle)]
        pages += 1
        following = next((link["url"] for link in bundle["link"] if link["relation"] == "next"), None)
        if following is None:
            break
        assert following.startswith(fhir.base + "/Observation?") and "_cursor=" in following
        before = fhir_ehr.stats()["fhir"]
        bundle = fhir.ok(following)
        requests.append(fhir_ehr.stats()["fhir"] - before)
    assert len(seen) == len(expected) and set(seen) == expected and pages == len(expected) // 50 + 1
    assert max(requests) <= 3, requests                     # the page's EHR page, and at most 2 for `total`
    assert bundle["total"] == len(expected)                 # the last page knows it
    assert fhir.search("Observation", {"_count": 100}).get("total") is None      # too far to count
    # An app's own `_offset` reads the EHR's search from its first page, within the 20 EHR pages one
    # request may read: past them, a 400 pointing at the next links (it was a 502, the EHR's fault).
    assert len(resources(fhir.search("Observation", {"_offset": 500, "_count": 10}))) == 10
    status, _, body = fhir.get("/Observation", {"_offset": 1500, "_count": 10})
    assert status == 400 and outcome(body) == "invalid" and "_offset" in body["issue"][0]["diagnostics"], body

    # The cursor is bound to its search, clinic and patient, and signed.
    second = fhir.search("Observation", {})
    following = next(link["url"] for link in second["link"] if link["relation"] == "next")
    cursor = urllib.parse.parse_qs(urllib.parse.urlsplit(following).query)["_cursor"][0]
    decoded = base64.urlsafe_b64decode(cursor.split(".")[0] + "==").decode()
    assert json.loads(decoded)["l"].startswith("Observation?") and f":{fhir_ehr.port}" not in decoded  # no EHR host
    for params in ({"patient": "pt-a", "_cursor": cursor}, {"code": "8867-4", "_cursor": cursor},
                   {"_cursor": cursor[:-2] + ("AA" if cursor[-2:] != "AA" else "BB")}, {"_cursor": "x" * 5000}):
        status, _, body = fhir.get("/Observation", params)
        assert status == 400 and outcome(body) == "invalid", (params, body)
    mine = mint_platform_token(runtime, live, create_user(org_id, "ben@grants.example", "Ben", "Okafor", "bokafor",
                                                          "1417000019"), world.app, org_id,
                               scope="openid launch patient/*.rs", patient="pt-b")
    status, _, body = Fhir(live, org_id, mine).get("/Observation", {"_cursor": cursor})
    assert status == 400 and outcome(body) == "invalid"
    assert fhir.ok(following)["entry"][0]["resource"]["id"] not in [r["id"] for r in resources(second)]


def test_metadata_of_a_clinic_whose_ehr_never_answered_is_a_503(grants_clinic, fhir_ehr, runtime):
    """With nothing kept yet and the EHR down, the clinic's CapabilityStatement cannot be told: 503
    with Retry-After (never a statement claiming what the EHR may not grant); once kept, it outlives
    an outage (tests/test_fhir_api_on_ehr.py)."""
    org_id, fhir = grants_clinic
    fhir_ehr.fault(503, count=1000, retry_after=0)
    try:
        status, headers, body = fhir.get("/metadata")
        assert status == 503 and headers["Retry-After"] and outcome(body) == "transient", body
    finally:
        fhir_ehr.fault(503, count=0)
    code, _ = ehr_check(runtime.settings, org_id)                 # the operator's check keeps it
    assert code == 0 and "CarePlan" in listed(fhir.ok("/metadata"))


def test_a_read_on_the_ioloop_renews_svc_auths_token_and_waits_out_a_429(grants_clinic, fhir_ehr):
    """Issue 46 item 7: a read's exchange with the EHR runs on the IOLoop (`connectors.fhir.aio`).
    svc-auth's token expired at the EHR (401): one new token (asked on the pool), the read answered;
    the EHR's 429s: each Retry-After waited out on the loop, then the read answered."""
    _, fhir = grants_clinic
    assert fhir.ok("/Patient/pt-a")["id"] == "pt-a"
    tokens = fhir_ehr.stats()["token"]
    fhir_ehr.expire_tokens()
    assert fhir.ok("/Patient/pt-a")["id"] == "pt-a"
    assert fhir_ehr.stats()["token"] == tokens + 1
    assert fhir.ok("/Patient/pt-a")["id"] == "pt-a"
    assert fhir_ehr.stats()["token"] == tokens + 1                  # kept for the next read
    fhir_ehr.fault(429, count=2, retry_after=0.3)
    began = time.monotonic()
    assert fhir.ok("/Patient/pt-a")["id"] == "pt-a"
    assert time.monotonic() - began >= 2 * 0.3 and fhir_ehr.stats()["faults"] >= 2
