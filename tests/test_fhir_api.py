"""The platform FHIR R4 API for apps (`/fhir/r4/{org}`), over real HTTP against a `svc-auth serve`
process on both databases: metadata, read and search of every type on the sandbox EHR, the token,
clinic, app and scope checks, CORS, bad and hostile input, and the token of a real launch."""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import urllib.parse

import pytest

from fhir_api_support import ALL_TYPES, Fhir, mint, outcome, resources
from js_support import http
from lifecycle.applications import install_application, register_application
from lifecycle.organizations import create_organization
from lifecycle.users import create_user
from models.application import Application, Installation
from models.directory import User

US_CORE = "http://hl7.org/fhir/us/core/StructureDefinition/"
NPI = "http://hl7.org/fhir/sid/us-npi"


def test_metadata_is_a_public_capability_statement(live, world):
    fhir = Fhir(live, world.org.id, None)
    status, headers, body = fhir.get("/metadata", headers={"Origin": "https://anywhere.example"})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == "*"
    assert headers["Content-Type"].startswith("application/fhir+json")
    assert body["resourceType"] == "CapabilityStatement" and body["fhirVersion"] == "4.0.1"
    assert body["format"] == ["json"] and body["kind"] == "instance"
    rest = body["rest"][0]
    assert rest["mode"] == "server"
    assert rest["security"]["service"][0]["coding"][0]["code"] == "SMART-on-FHIR"
    uris = {e["url"]: e["valueUri"] for e in rest["security"]["extension"][0]["extension"]}
    assert uris == {"authorize": f"{live}/v1/oauth/authorize", "token": f"{live}/v1/oauth/token",
                    "introspect": f"{live}/v1/oauth/introspect", "revoke": f"{live}/v1/oauth/revoke"}
    served = {r["type"]: r for r in rest["resource"]}
    assert set(served) == set(ALL_TYPES)
    for resource in served.values():
        assert {i["code"] for i in resource["interaction"]} == {"read", "search-type"}
        assert "_id" in {p["name"] for p in resource["searchParam"]}
    assert {p["name"] for p in served["Appointment"]["searchParam"]} >= {"patient", "practitioner", "actor", "date"}
    # JSON only.
    assert fhir.get("/metadata", {"_format": "json"})[0] == 200
    status, _, body = fhir.get("/metadata", {"_format": "xml"})
    assert status == 406 and outcome(body) == "not-supported"
    status, _, body = fhir.get("/metadata", headers={"Accept": "application/fhir+xml"})
    assert status == 406 and outcome(body) == "not-supported"
    assert fhir.get("/metadata", headers={"Accept": "application/fhir+xml, application/json;q=0.5"})[0] == 200


def test_read_and_search_every_type(live, runtime, world):
    fhir = Fhir(live, world.org.id, mint(runtime, live, world.physician, world.app, world.org.id))
    today = runtime.clock.now().date()
    for resource_type in ALL_TYPES:
        bundle = fhir.search(resource_type, {"_count": 3})
        found = resources(bundle)
        assert found and len(found) <= 3, (resource_type, bundle)
        # `total` is left out only when counting past the page would take more than 1000 matches.
        assert bundle.get("total", 1004) >= 4 if len(found) == 3 else bundle["total"] == len(found)
        assert bundle["link"][0]["relation"] == "self"
        for entry in bundle["entry"]:
            resource = entry["resource"]
            assert resource["resourceType"] == resource_type
            assert entry["fullUrl"] == f"{fhir.base}/{resource_type}/{resource['id']}"
            assert entry["search"] == {"mode": "match"}
            if resource_type != "Appointment":  # US Core profiles no Appointment
                assert resource["meta"]["profile"][0].startswith(US_CORE), resource
        first = found[0]
        assert fhir.ok(f"/{resource_type}/{first['id']}") == first
        assert fhir.search(resource_type, {"_id": first["id"]})["total"] == 1

    # Patient: US Core shape, and the demo-style ids verbatim.
    patient = resources(fhir.search("Patient", {"_count": 1}))[0]
    assert patient["id"].startswith("pat_") and patient["gender"] in ("male", "female")
    assert patient["name"][0]["family"] and patient["birthDate"] and patient["identifier"]
    # Practitioner: the clinic's physician with the NPI identifier; found by NPI.
    practitioner = fhir.ok(f"/Practitioner/{world.physician.id}")
    assert practitioner["identifier"] == [{"system": NPI, "value": world.physician.npi}]
    by_npi = fhir.search("Practitioner", {"identifier": f"{NPI}|{world.physician.npi}"})
    assert [r["id"] for r in resources(by_npi)] == [world.physician.id]
    assert fhir.search("Practitioner", {"identifier": f"urn:other|{world.physician.npi}"})["total"] == 0
    assert fhir.search("Practitioner", {"identifier": "0000000000"})["total"] == 0

    # Appointments: the practitioner's, in a date range, each naming patient and practitioner.
    start, end = today + dt.timedelta(days=1), today + dt.timedelta(days=8)
    bundle = fhir.search("Appointment", [("practitioner", f"Practitioner/{world.physician.id}"),
                                         ("date", f"ge{start}"), ("date", f"lt{end}"), ("_count", 100)])
    appointments = resources(bundle)
    assert appointments and bundle["total"] == len(appointments)
    for appointment in appointments:
        assert str(start) <= appointment["start"][:10] < str(end)
        actors = [p["actor"].get("reference") for p in appointment["participant"]]
        assert f"Practitioner/{world.physician.id}" in actors
        assert any(a and a.startswith("Patient/pat_") for a in actors)
        assert appointment["status"] == "booked"
    patient_id = next(a for a in (p["actor"].get("reference") for p in appointments[0]["participant"])
                      if a and a.startswith("Patient/"))
    theirs = resources(fhir.search("Appointment", {"actor": patient_id, "_count": 100}))
    assert theirs and all(patient_id in [p["actor"].get("reference") for p in a["participant"]] for a in theirs)

    # A chart: conditions, vital signs (LOINC), medications, allergies, encounters of one patient.
    pid = patient_id.split("/")[1]
    conditions = resources(fhir.search("Condition", {"patient": pid}))
    assert conditions and all(c["subject"]["reference"] == patient_id for c in conditions)
    assert conditions[0]["category"][0]["coding"][0]["code"] == "problem-list-item"
    assert conditions[0]["clinicalStatus"]["coding"][0]["code"] == "active"
    assert conditions[0]["code"]["coding"][0]["system"] == "http://hl7.org/fhir/sid/icd-10-cm"
    encounters = resources(fhir.search("Encounter", {"subject": patient_id, "_count": 100}))
    observations = fhir.search("Observation", {"patient": pid, "_count": 100})
    vitals = resources(observations)
    assert len(vitals) == min(100, 4 * len(encounters)) and observations["total"] == 4 * len(encounters)
    codes = {o["code"]["coding"][0]["code"] for o in vitals}
    assert codes == {"85354-9", "8867-4", "8310-5", "29463-7"}
    bp = next(o for o in vitals if o["code"]["coding"][0]["code"] == "85354-9")
    assert {c["code"]["coding"][0]["code"] for c in bp["component"]} == {"8480-6", "8462-4"}
    assert bp["category"][0]["coding"][0]["code"] == "vital-signs"
    assert fhir.ok(f"/{bp['encounter']['reference']}")["subject"]["reference"] == patient_id
    # Dates: an encounter's day finds it; a range before the history finds nothing.
    day = encounters[0]["period"]["start"]
    assert encounters[0]["id"] in [e["id"] for e in resources(fhir.search("Encounter", {"patient": pid, "date": day}))]
    assert fhir.search("Encounter", {"patient": pid, "date": "lt2000"})["total"] == 0
    # Token search on codings: code and category, with or without the system; a comma is OR.
    heart = resources(fhir.search("Observation", {"patient": pid, "code": "http://loinc.org|8867-4", "_count": 100}))
    assert len(heart) == len(encounters) and {o["code"]["coding"][0]["code"] for o in heart} == {"8867-4"}
    both = fhir.search("Observation", {"patient": pid, "code": "8867-4,http://loinc.org|29463-7", "_count": 3,
                                       "_offset": 2})
    assert both["total"] == 2 * len(encounters) and len(resources(both)) == min(3, 2 * len(encounters) - 2)
    assert fhir.search("Observation", {"patient": pid, "code": "urn:other|8867-4"})["total"] == 0
    assert fhir.search("Observation", {"patient": pid, "category": "vital-signs"})["total"] == 4 * len(encounters)
    assert fhir.search("Observation", {"patient": pid, "category": "laboratory"})["total"] == 0
    assert fhir.search("Condition", {"patient": pid, "category": "problem-list-item"})["total"] == len(conditions)
    first_code = conditions[0]["code"]["coding"][0]["code"]
    assert conditions[0]["id"] in [c["id"] for c in resources(fhir.search("Condition", {"patient": pid,
                                                                                        "code": first_code}))]
    for resource_type in ("MedicationRequest", "AllergyIntolerance"):
        for resource in resources(fhir.search(resource_type, {"patient": pid})):
            assert (resource.get("subject") or resource.get("patient"))["reference"] == patient_id


def test_paging_follows_next_links_to_the_end(live, runtime, world):
    fhir = Fhir(live, world.org.id, mint(runtime, live, world.physician, world.app, world.org.id))
    first = fhir.search("Patient", {"_count": 40})
    assert first["total"] == 150
    seen, bundle, pages = [], first, 0
    while True:
        seen += [r["id"] for r in resources(bundle)]
        pages += 1
        following = [link["url"] for link in bundle["link"] if link["relation"] == "next"]
        if not following:
            break
        assert following[0].startswith(fhir.base + "/Patient?")
        bundle = fhir.ok(following[0])
    assert pages == 4 and len(seen) == len(set(seen)) == 150
    assert fhir.search("Patient", {"_count": 1000})["total"] == 150  # capped at 100 a page
    assert len(resources(fhir.search("Patient", {"_count": 1000}))) == 100


def test_patient_scope_reaches_only_the_launch_patient(live, runtime, world):
    token_fhir = Fhir(live, world.org.id, mint(runtime, live, world.physician, world.app, world.org.id))
    patients = [r["id"] for r in resources(token_fhir.search("Patient", {"_count": 2}))]
    mine, other = patients
    fhir = Fhir(live, world.org.id, mint(runtime, live, world.physician, world.app, world.org.id,
                                         scope="openid launch/patient patient/*.rs", patient=mine))
    assert fhir.ok(f"/Patient/{mine}")["id"] == mine
    status, _, body = fhir.get(f"/Patient/{other}")
    assert status == 404 and outcome(body) == "not-found"
    assert [r["id"] for r in resources(fhir.search("Patient"))] == [mine]
    conditions = resources(fhir.search("Condition"))
    assert conditions and {c["subject"]["reference"] for c in conditions} == {f"Patient/{mine}"}
    assert fhir.search("Condition", {"patient": other})["total"] == 0
    others = resources(token_fhir.search("Condition", {"patient": other}))
    assert fhir.get(f"/Condition/{others[0]['id']}")[0] == 404
    for appointment in resources(fhir.search("Appointment", {"_count": 100})):
        assert f"Patient/{mine}" in [p["actor"].get("reference") for p in appointment["participant"]]

    # patient/Patient.rs only: no Appointments at all (403), still not the other patient (404).
    narrow = Fhir(live, world.org.id, mint(runtime, live, world.physician, world.app, world.org.id,
                                          scope="openid patient/Patient.rs", patient=mine))
    status, _, body = narrow.get("/Appointment")
    assert status == 403 and outcome(body) == "forbidden"
    assert narrow.get(f"/Condition/{conditions[0]['id']}")[0] == 403
    assert narrow.get(f"/Patient/{other}")[0] == 404
    assert narrow.ok(f"/Patient/{mine}")["id"] == mine
    # A read-only scope does not search, a search-only scope does not read.
    read_only = Fhir(live, world.org.id, mint(runtime, live, world.physician, world.app, world.org.id,
                                             scope="user/Patient.r"))
    assert read_only.get("/Patient")[0] == 403 and read_only.get(f"/Patient/{mine}")[0] == 200
    # A patient/ scope without a patient in the token reaches nothing.
    no_context = Fhir(live, world.org.id, mint(runtime, live, world.physician, world.app, world.org.id,
                                              scope="patient/*.rs"))
    assert no_context.get(f"/Patient/{mine}")[0] == 403


def test_the_application_declared_scopes_bound_the_token(live, runtime, world):
    """The app's current `smart_scopes` cap what any of its tokens reaches."""
    narrow, _ = register_application(runtime, "Narrow", "https://narrow.example/cb", "https://narrow.example/l")
    Application.update(smart_scopes="launch openid patient/Patient.rs").where(Application.id == narrow.id).execute()
    install_application(narrow.id, world.org.id)
    fhir = Fhir(live, world.org.id, mint(runtime, live, world.physician, narrow, world.org.id, scope="user/*.rs"))
    assert fhir.get("/Condition")[0] == 403
    status, _, body = fhir.get("/Patient")
    assert status == 403 and "patient" in body["issue"][0]["diagnostics"]  # patient/ only, and no patient context


def test_a_clinic_token_never_reaches_another_clinic(live, runtime, world):
    other = create_organization("Other Clinic", "sandbox", "https://ehr.example/other")
    other_doc = create_user(other.id, "other@example.com", "Oth", "Er", "oer", "1245319599")
    install_application(world.app.id, other.id)
    mine = Fhir(live, world.org.id, mint(runtime, live, world.physician, world.app, world.org.id))
    theirs = Fhir(live, other.id, mint(runtime, live, other_doc, world.app, other.id))
    their_patient = resources(theirs.search("Patient", {"_count": 1}))[0]["id"]
    # Clinic A's token on clinic B's base: 404 like a base that does not exist.
    cross = Fhir(live, other.id, mine.token)
    for path in ("/Patient", f"/Patient/{their_patient}", f"/Practitioner/{other_doc.id}"):
        status, _, body = cross.get(path)
        assert status == 404 and outcome(body) == "not-found", path
    assert Fhir(live, "org_does_not_exist", mine.token).get("/Patient")[0] == 404
    # Clinic B's ids under clinic A's base: not there.
    assert mine.get(f"/Patient/{their_patient}")[0] == 404
    assert mine.get(f"/Practitioner/{other_doc.id}")[0] == 404
    assert mine.search("Practitioner", {"_id": other_doc.id})["total"] == 0


def test_tokens_that_are_missing_bad_expired_or_revoked_get_401(live, runtime, world):
    patient = "pat_b15c092f2447b7a2"
    status, headers, body = Fhir(live, world.org.id, None).get(f"/Patient/{patient}")
    assert status == 401 and outcome(body) == "login"
    assert headers["WWW-Authenticate"].startswith("Bearer realm=") and "error=" not in headers["WWW-Authenticate"]
    expired = mint(runtime, live, world.physician, world.app, world.org.id, ttl=60, clock_offset=-3600)
    for token in ("garbage", "a.b.c", expired, "x" * 9000):
        status, headers, body = Fhir(live, world.org.id, token).get("/Patient")
        assert status == 401 and outcome(body) == "login", token[:20]
        assert 'error="invalid_token"' in headers["WWW-Authenticate"]
    # Revoked through the real revocation endpoint by the app itself.
    token = mint(runtime, live, world.physician, world.app, world.org.id)
    fhir = Fhir(live, world.org.id, token)
    assert fhir.get("/Patient", {"_count": 1})[0] == 200
    status, _, _ = http("POST", f"{live}/v1/oauth/revoke", urllib.parse.urlencode(
        {"token": token, "client_id": world.app.client_id, "client_secret": world.secret}).encode(),
        {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 200
    status, headers, body = fhir.get("/Patient", {"_count": 1})
    assert status == 401 and 'error="invalid_token"' in headers["WWW-Authenticate"]
    # A user who left the clinic (deleted): their live token reads nothing.
    leaver = create_user(world.org.id, "leaver@example.com", "Lea", "Ver", "lver")
    fhir = Fhir(live, world.org.id, mint(runtime, live, leaver, world.app, world.org.id))
    assert fhir.get("/Patient", {"_count": 1})[0] == 200
    User.delete().where(User.id == leaver.id).execute()
    status, headers, _ = fhir.get("/Patient", {"_count": 1})
    assert status == 401 and 'error="invalid_token"' in headers["WWW-Authenticate"]
    # An ID-token-shaped or partner-API token is not a platform access token.
    partner, _ = runtime.tokens.__class__(runtime.keyring, live + "/", runtime.clock).access_token(
        world.app.id, "partner_api", 600, client_id=world.app.client_id, org=world.org.id, scope="user/*.rs")
    assert Fhir(live, world.org.id, partner).get("/Patient")[0] == 401


def test_an_app_disabled_or_uninstalled_in_the_clinic_gets_403(live, runtime, world):
    fhir = Fhir(live, world.org.id, mint(runtime, live, world.physician, world.app, world.org.id))
    assert fhir.get("/Patient", {"_count": 1})[0] == 200
    Installation.update(activation_status="Disabled").where(Installation.application == world.app.id).execute()
    status, _, body = fhir.get("/Patient", {"_count": 1})
    assert status == 403 and "Disabled" in body["issue"][0]["diagnostics"]
    Installation.update(activation_status="Enabled").where(Installation.application == world.app.id).execute()
    assert fhir.get("/Patient", {"_count": 1})[0] == 200
    Installation.delete().where(Installation.application == world.app.id).execute()
    status, _, body = fhir.get("/Patient", {"_count": 1})
    assert status == 403 and outcome(body) == "forbidden"


def test_bad_parameters_and_hostile_input_are_4xx_operation_outcomes(live, runtime, world):
    fhir = Fhir(live, world.org.id, mint(runtime, live, world.physician, world.app, world.org.id))
    cases = [
        ("/Patient", {"name": "Lena"}, 400),                       # unsupported parameter: strict
        ("/Patient", {"_id:missing": "true"}, 400),                # modifiers are not supported
        ("/Appointment", {"date": "tomorrow"}, 400),
        ("/Appointment", {"date": "ne2026-01-01"}, 400),
        ("/Appointment", {"date": "2026-13-01"}, 400),
        ("/Appointment", {"date": "2026-01-01T10:00"}, 400),       # a time needs a zone
        ("/Appointment", [("date", "ge2026"), ("date", "le2027"), ("date", "lt2028")], 400),
        ("/Appointment", {"actor": "pat_b15c092f2447b7a2"}, 400),  # actor needs its type
        ("/Condition", {"patient": "Practitioner/usr_1"}, 400),
        ("/Condition", [("patient", "a"), ("patient", "b")], 400),
        ("/Observation", {"code": "http://loinc.org|"}, 400),
        ("/Encounter", {"code": "AMB"}, 400),                      # not a parameter of Encounter here
        ("/Patient", {"_count": "ten"}, 400),
        ("/Patient", {"_count": "0"}, 400),
        ("/Patient", {"_count": "-1"}, 400),
        ("/Patient", {"_offset": "99999999999"}, 400),
        ("/Patient", {"_id": "a\x00b"}, 400),
        ("/Patient", {"_id": "x" * 600}, 400),
        ("/Patient", {"_id": ",".join(f"p{i}" for i in range(101))}, 400),
        ("/Patient", {"_format": "xml"}, 406),
        ("/Patient/a%00b", None, 400),
        ("/Patient/" + "x" * 5000, None, 400),
        ("/Patient/pat%252Fx", None, 400),                         # double-encoded
        ("/Patient/%2e%2e", None, 400),
        ("/Patient/%ff%fe", None, 400),                            # not UTF-8
        ("/Patient/%7B%22a%22%3A%5B%5B%5B%5B1%5D%5D%5D%5D%7D", None, 400),  # nested JSON as an id
        ("/Medication/x", None, 404),                              # a type not served
        ("/Medication", None, 404),
    ]
    for path, params, expected in cases:
        status, headers, body = fhir.get(path, params)
        assert status == expected, (path, params, status, body)
        assert outcome(body) and headers["Content-Type"].startswith("application/fhir+json"), (path, params)
    status, _, body = fhir.get("/Patient?_id=%ff")
    assert status == 400 and outcome(body) == "invalid"
    # Not a method this API has.
    status, _, body = http("POST", f"{fhir.base}/Patient", b"{}", {"Authorization": f"Bearer {fhir.token}",
                                                                  "Content-Type": "application/fhir+json"})
    assert status == 405 and outcome(json.loads(body)) == "not-supported"


def test_cors_for_the_application_registered_origins(live, runtime, world):
    origin = "https://smart-app.example"
    Application.update(allowed_origins=[origin]).where(Application.id == world.app.id).execute()
    fhir = Fhir(live, world.org.id, mint(runtime, live, world.physician, world.app, world.org.id))
    status, headers, _ = http("OPTIONS", f"{fhir.base}/Patient", None, {
        "Origin": origin, "Access-Control-Request-Method": "GET", "Access-Control-Request-Headers": "authorization"})
    assert status == 204 and headers["Access-Control-Allow-Origin"] == origin
    assert "Authorization" in headers["Access-Control-Allow-Headers"]
    status, headers, _ = fhir.get("/Patient", {"_count": 1}, headers={"Origin": origin})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == origin
    status, headers, _ = fhir.get("/Patient/nope", headers={"Origin": origin})
    assert status == 404 and headers["Access-Control-Allow-Origin"] == origin  # errors are readable too
    for other in ("https://evil.example", "null"):
        status, headers, _ = fhir.get("/Patient", {"_count": 1}, headers={"Origin": other})
        assert status == 200 and "Access-Control-Allow-Origin" not in headers
        status, headers, _ = http("OPTIONS", f"{fhir.base}/Patient", None, {
            "Origin": other, "Access-Control-Request-Method": "GET"})
        assert "Access-Control-Allow-Origin" not in headers


def test_the_token_of_a_real_launch_reads_what_its_scope_grants(live, runtime, world):
    """launch -> authorize -> token over HTTP, as an app does; the scope is what that flow grants."""
    from lifecycle.sandbox import issue_sandbox_token
    from oauth.smart_scopes import access
    from oauth.tokens import TokenService
    as_live = type("AsLive", (), {"tokens": TokenService(runtime.keyring, live + "/", runtime.clock),
                                  "settings": runtime.settings, "clock": runtime.clock})()
    sandbox = issue_sandbox_token(as_live, world.physician)
    status, _, body = http("POST", f"{live}/v1/sandbox/launches", json.dumps({"client_id": world.app.client_id}).encode(),
                           {"Authorization": f"Bearer {sandbox}", "Content-Type": "application/json"})
    assert status == 201, body
    query = {"client_id": world.app.client_id, "redirect_uri": world.app.redirect_uri, "response_type": "code",
             "launch_id": json.loads(body)["launch_id"]}
    status, headers, body = http("GET", f"{live}/v1/oauth/authorize?{urllib.parse.urlencode(query)}")
    assert status == 302, body
    code = urllib.parse.parse_qs(urllib.parse.urlsplit(headers["Location"]).query)["code"][0]
    status, _, body = http("POST", f"{live}/v1/oauth/token", json.dumps({
        "grant_type": "authorization_code", "client_id": world.app.client_id, "client_secret": world.secret,
        "code": code}).encode(), {"Content-Type": "application/json"})
    assert status == 200, body
    tokens = json.loads(body)
    fhir = Fhir(live, world.org.id, tokens["access_token"])
    granted = access(tokens.get("scope"), "Practitioner", "r")
    status, _, body = fhir.get(f"/Practitioner/{world.physician.id}")
    if granted.allowed:
        assert status == 200 and body["identifier"][0]["value"] == world.physician.npi
    else:
        assert status == 403 and outcome(body) == "forbidden", (tokens.get("scope"), body)
    # Whatever was granted, the token is the clinic's only.
    other = create_organization("Elsewhere", "sandbox", "https://ehr.example/elsewhere")
    assert Fhir(live, other.id, tokens["access_token"]).get("/Patient")[0] == 404


def test_an_ehr_that_is_down_answers_503_with_retry_after(live, runtime, world):
    down = create_organization("Down Clinic", "sandbox", "https://ehr.example/down?outage=1")
    doc = create_user(down.id, "down@example.com", "Do", "Wn", "dwn", "1003000126")
    install_application(world.app.id, down.id)
    fhir = Fhir(live, down.id, mint(runtime, live, doc, world.app, down.id))
    for path in ("/Patient", "/Patient/pat_b15c092f2447b7a2"):
        status, headers, body = fhir.get(path)
        assert status == 503 and headers["Retry-After"] == "5" and outcome(body) == "transient", body
    assert fhir.get("/metadata")[0] == 200  # no EHR call


def test_date_parameters_become_half_open_utc_ranges():
    from fhir_api.search import date_range
    d = dt.datetime
    assert date_range(["2026-03"], "date") == (d(2026, 3, 1), d(2026, 4, 1))
    assert date_range(["2026-12"], "date") == (d(2026, 12, 1), d(2027, 1, 1))
    assert date_range(["gt2026-03-01"], "date") == (d(2026, 3, 2), None)
    assert date_range(["le2026"], "date") == (None, d(2027, 1, 1))
    assert date_range(["ge2026-01-01", "lt2026-02-03T10:00:00+02:00"], "date") == (d(2026, 1, 1), d(2026, 2, 3, 8))
    assert date_range(["eq2026-02-03T10:00Z"], "date") == (d(2026, 2, 3, 10), d(2026, 2, 3, 10, 1))
    assert date_range(["lt2026", "gt2027"], "date") == (d(2028, 1, 1), d(2026, 1, 1))  # empty: the API answers none


def test_the_sandbox_connector_reads_back_every_resource_it_finds(runtime, world):
    """Every id a search returns reads back the same resource; ids of one kind never read as another."""
    from connectors import ResourceNotFound, ResourceQuery, connector_for
    connector = connector_for(runtime, world.org)
    patient = connector.panel()[3].id
    for resource_type in ALL_TYPES:
        query = ResourceQuery(resource_type, patient=None if resource_type == "Practitioner" else patient, count=500)
        found = list(connector.search_resources(query))
        assert found or resource_type in ("MedicationRequest", "AllergyIntolerance"), resource_type
        for resource in found:
            assert connector.read_resource(resource_type, resource["id"]) == resource
        if found and resource_type not in ("Patient", "Practitioner"):
            assert [r["id"] for r in connector.search_resources(dataclasses.replace(query, offset=1))] == \
                [r["id"] for r in found[1:]]
            wrong = "Condition" if resource_type != "Condition" else "Encounter"
            with pytest.raises(ResourceNotFound):
                connector.read_resource(wrong, found[0]["id"])
    for junk in ("pat_zz", "enc_0000000000000000_0", "obs_" + patient[4:] + "_0_xx", "cnd_" + patient[4:] + "_99"):
        with pytest.raises(ResourceNotFound):
            connector.read_resource("Condition" if junk.startswith("cnd") else "Encounter", junk)
