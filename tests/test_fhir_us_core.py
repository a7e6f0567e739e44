"""US Core 6.1's SHALL searches, type by type, through HTTP against `svc-auth serve`, on both kinds
of clinic: the demo sandbox clinic, and a FHIR clinic whose EHR (the Medplum test EHR) holds a full
US Core record. As the US Core test kit does: a patient's resources of each type are found by
`patient`, then every SHALL combination is built from the values the first one holds (`system|code`
and `code`, `patient=X` and `patient=Patient/X`, each date comparator, multiple-or where US Core
says so) and must find it again, within the patient's compartment. Every body served is validated
against R4 by Medplum's `validateResource` (tests/js/validate_fhir.mjs), a validator nobody here wrote."""
from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass

import pytest

from helpers.fhir_api import Fhir, resources
from helpers.fhir_ehr import connect_clinic, practitioner
from helpers.r4 import r4_invalid
from helpers.tokens import mint_platform_token
from lifecycle.applications import install_application, set_fhir_rate_limits
from lifecycle.users import create_user
from ratelimit.policy import Limit

from connectors.sandbox import SandboxConnector, patient_panel

pytestmark = pytest.mark.slow

PATIENT_SHALL = {
    "AllergyIntolerance": [("patient",)],
    "CarePlan": [("patient", "category")],
    "CareTeam": [("patient", "status")],
    "Condition": [("patient",)],
    "Coverage": [("patient",)],
    "Device": [("patient",)],
    "DiagnosticReport": [("patient",), ("patient", "category"), ("patient", "code"), ("patient", "category", "date")],
    "DocumentReference": [("_id",), ("patient",), ("patient", "category"), ("patient", "category", "date"),
                          ("patient", "type")],
    "Encounter": [("_id",), ("patient",), ("date", "patient"), ("identifier",)],
    "FamilyMemberHistory": [("patient",)],
    "Goal": [("patient",)],
    "Immunization": [("patient",)],
    "MedicationDispense": [("patient",), ("patient", "status")],
    "MedicationRequest": [("patient", "intent"), ("patient", "intent", "status")],
    "Observation": [("patient", "category"), ("patient", "code"), ("patient", "category", "date")],
    "Procedure": [("patient",), ("patient", "date")],
    "QuestionnaireResponse": [("_id",), ("patient",)],
    "RelatedPerson": [("_id",), ("patient",)],
    "ServiceRequest": [("_id",), ("patient",), ("patient", "category"), ("patient", "code"),
                       ("patient", "category", "authored")],
    "Specimen": [("_id",), ("patient",)],
}
"""US Core 6.1 (us-core-server): the SHALL search combinations of each type of a patient's record."""
DIRECTORY_SHALL = {
    "Patient": [("_id",), ("identifier",), ("name",), ("birthdate", "name"), ("gender", "name")],
    "Practitioner": [("name",), ("identifier",)],
    "PractitionerRole": [("specialty",), ("practitioner",)],
    "Organization": [("name",), ("address",)],
    "Location": [("name",), ("address",)],
}
"""The SHALL (Location, Organization: SHOULD) searches of the other types, found from the patient's and clinic's."""
MULTIPLE_OR = {"MedicationRequest": {"intent": "proposal,plan,order,original-order", "status": "active,completed,stopped"},
               "CareTeam": {"status": "proposed,active"}, "MedicationDispense": {"status": "in-progress,completed"}}
ELEMENTS = {"date": {"DiagnosticReport": "effectiveDateTime", "DocumentReference": "date", "Encounter": "period",
                     "Observation": "effectiveDateTime", "Procedure": "performedDateTime"},
            "authored": {"ServiceRequest": "authoredOn"}, "birthdate": {"Patient": "birthDate"}}
"""Where each date parameter's value is, by type (the test's own reading of R4's search parameters)."""
SANDBOX_ID = re.compile(r"\b(pat|enc|cnd|obs|med|alg|imm|prc|dev|gol|drp|srq|spc|doc|fmh|rel|cov|cpl|ctm|qre|mdd|prv|mdc|"
                        r"loc|rol|org|usr)_")


@dataclass
class Clinic:
    fhir: Fhir
    patient: str
    other_patient: str
    kind: str


def record_patient(connector: SandboxConnector) -> str:
    """A sandbox patient whose record has every type (a device, a procedure, an order, an allergy)."""
    for patient in patient_panel(connector.organization_id):
        record, chart = connector.us_core_record(patient.id), connector.fetch_chart(patient.id)
        if record["devices"] and record["procedures"] and chart.medications and chart.allergies:
            return patient.id
    raise AssertionError("no sandbox patient with a full record")


def full_record(connector: SandboxConnector, patient_id: str) -> list[dict]:
    """The sandbox's US Core record of one patient and the clinic's directory, as an EHR would hold
    them: R4 ids (`_` -> `-`)."""
    from connectors import ResourceQuery
    found = [r for kind in ("Organization", "Location", "Medication", "PractitionerRole")
             for r in connector.search_resources(ResourceQuery(kind))]
    found += [r for kind in ("Patient",) + tuple(PATIENT_SHALL) + ("Provenance",)
              for r in connector.search_resources(ResourceQuery(kind, patient=patient_id))]
    return json.loads(SANDBOX_ID.sub(lambda m: m.group(1) + "-", json.dumps(found)))


@pytest.fixture(params=["sandbox", "fhir"])
def us_core_clinic(request, runtime, world, live) -> Clinic:
    """The clinic, its patient with a full record, another patient, and a `user/*.rs` client
    (the app's limits raised: the test kit makes a few hundred requests a minute)."""
    set_fhir_rate_limits(runtime, world.app.id, fhir_rate_limit=Limit(100000, 60), fhir_token_rate_limit=Limit(100000, 60))
    sandbox = SandboxConnector(world.org.id, world.org.name)
    patient_id = record_patient(sandbox)
    other = next(p.id for p in patient_panel(world.org.id) if p.id != patient_id)
    if request.param == "sandbox":
        token = mint_platform_token(runtime, live, world.physician, world.app, world.org.id)
        return Clinic(Fhir(live, world.org.id, token), patient_id, other, "sandbox")
    ehr = request.getfixturevalue("fhir_ehr")
    ehr.admin("reset", {})
    org_id = connect_clinic(runtime.settings, ehr, f"{live}/ehr/jwks.json", name="US Core Clinic")
    doctor = practitioner(world.physician.id, world.physician.npi, world.physician.family_name,
                          world.physician.given_name)
    record, other_record = full_record(sandbox, patient_id), full_record(sandbox, other)
    seen, unique = set(), []
    for resource in json.loads(SANDBOX_ID.sub(lambda m: m.group(1) + "-", json.dumps([doctor]))) + record + other_record:
        if (resource["resourceType"], resource["id"]) not in seen:
            seen.add((resource["resourceType"], resource["id"]))
            unique.append(resource)
    ehr.seed(*unique)
    install_application(world.app.id, org_id)
    user = create_user(org_id, "us-core@fhir.example", "Ana", "Core", "acore", "1417000043")
    token = mint_platform_token(runtime, live, user, world.app, org_id)
    to_r4 = (lambda ident: SANDBOX_ID.sub(lambda m: m.group(1) + "-", ident))
    return Clinic(Fhir(live, org_id, token), to_r4(patient_id), to_r4(other), "fhir")


def every_id(fhir: Fhir, kind: str, params: dict, served: list) -> list[str]:
    """The ids of every match, following `next` links."""
    bundle = fhir.search(kind, {**params, "_count": 100})
    served.append(bundle)
    found = [e["resource"]["id"] for e in bundle.get("entry", ()) if e["search"]["mode"] == "match"]
    while (next_url := next((l["url"] for l in bundle["link"] if l["relation"] == "next"), None)):
        assert next_url.startswith(fhir.base + "/"), next_url
        bundle = fhir.ok(next_url)
        served.append(bundle)
        found += [e["resource"]["id"] for e in bundle.get("entry", ()) if e["search"]["mode"] == "match"]
    return found


def token_values(value) -> list[str]:
    """`system|code` and `code` of an element (a code, Coding, CodeableConcept, Identifier, or a list)."""
    if isinstance(value, list):
        value = value[0]
    if isinstance(value, str):
        return [value]
    if "coding" in value:
        value = value["coding"][0]
    code = value.get("code", value.get("value"))
    return [f"{value['system']}|{code}", code] if value.get("system") else [code]


def day_of(value) -> str:
    return (value["start"] if isinstance(value, dict) else value)[:10]


def values(resource: dict, name: str, patient: str) -> list[str]:
    """The values of search parameter `name` that must find `resource` (every form US Core names)."""
    kind = resource["resourceType"]
    if name == "patient":
        return [patient, f"Patient/{patient}"]
    if name == "_id":
        return [resource["id"]]
    if name in ELEMENTS:
        day = dt.date.fromisoformat(day_of(resource[ELEMENTS[name][kind]]))
        return [day.isoformat(), f"ge{day}", f"le{day}", f"gt{day - dt.timedelta(days=1)}",
                f"lt{day + dt.timedelta(days=1)}", f"ge{day.year}", f"lt{day.year + 1}"]
    if name == "name":
        names = resource["name"]
        return [names[0]["family"], names[0]["family"].lower()[:3]] if isinstance(names, list) else [names, names[:4]]
    if name == "address":
        address = resource["address"][0] if isinstance(resource["address"], list) else resource["address"]
        return [address["city"], address["postalCode"]]
    if name == "practitioner":
        return [resource["practitioner"]["reference"], resource["practitioner"]["reference"].split("/")[1]]
    return token_values(resource[name])


def shall_searches(fhir: Fhir, resource: dict, combos, patient: str | None, served: list) -> int:
    """Each combination, each form of each value (one parameter varied at a time), finds `resource`."""
    kind, done = resource["resourceType"], 0
    for combo in combos:
        base = {name: values(resource, name, patient)[0] for name in combo}
        for name in combo:
            for value in values(resource, name, patient):
                params = {**base, name: value}
                found = every_id(fhir, kind, params, served)
                assert resource["id"] in found, (kind, params, found[:10])
                done += 1
    for name, value in MULTIPLE_OR.get(kind, {}).items():
        params = {"patient": patient, **({"intent": resource["intent"]} if kind == "MedicationRequest" else {}), name: value}
        assert resource["id"] in every_id(fhir, kind, params, served), (kind, params)
        done += 1
    return done


def of_patient(resource: dict) -> str:
    for name in ("subject", "patient", "beneficiary"):
        if name in resource:
            return resource[name]["reference"]
    return ""


def test_every_us_core_shall_search_works_on_both_kinds_of_clinic(us_core_clinic):
    clinic = us_core_clinic
    fhir, patient, served = clinic.fhir, clinic.patient, []
    metadata = fhir.ok("/metadata")
    served.append(metadata)
    assert metadata["instantiates"] == ["http://hl7.org/fhir/us/core/CapabilityStatement/us-core-server",
                                        "http://hl7.org/fhir/uv/bulkdata/CapabilityStatement/bulk-data"]  # issue 48
    listed = {r["type"]: r for r in metadata["rest"][0]["resource"]}
    assert set(PATIENT_SHALL) | set(DIRECTORY_SHALL) | {"Medication", "Provenance"} <= set(listed)

    searches, first = 0, {}
    for kind, combos in PATIENT_SHALL.items():
        found = resources(fhir.search(kind, {"patient": patient, "_count": 100}))
        assert found, kind
        assert {of_patient(r) for r in found} == {f"Patient/{patient}"}, kind       # the compartment only
        first[kind] = found[0]
        served += found
        assert fhir.ok(f"/{kind}/{found[0]['id']}") == found[0]                         # read
        searches += shall_searches(fhir, found[0], combos, patient, served)
        # Every SHALL parameter is in the CapabilityStatement.
        assert {n for combo in combos for n in combo} <= {p["name"] for p in listed[kind]["searchParam"]}, kind
        assert listed[kind].get("supportedProfile") or kind == "FamilyMemberHistory", kind

    me = fhir.ok(f"/Patient/{patient}")
    role = resources(fhir.search("PractitionerRole", {}))[0]
    directory = {"Patient": me, "Practitioner": fhir.ok(f"/{role['practitioner']['reference']}"), "PractitionerRole": role,
                 "Organization": resources(fhir.search("Organization", {}))[0],
                 "Location": resources(fhir.search("Location", {}))[0]}
    for kind, resource in directory.items():
        served.append(resource)
        searches += shall_searches(fhir, resource, DIRECTORY_SHALL[kind], None, served)
    assert searches > 150

    # _include: the order's Medication; _revinclude: the Provenance of each condition.
    bundle = fhir.search("MedicationRequest", {"patient": patient, "intent": "order",
                                                 "_include": "MedicationRequest:medication"})
    served.append(bundle)
    orders = [e["resource"] for e in bundle["entry"] if e["search"]["mode"] == "match"]
    included = [e["resource"] for e in bundle["entry"] if e["search"]["mode"] == "include"]
    assert orders and {f"Medication/{m['id']}" for m in included} == \
        {o["medicationReference"]["reference"] for o in orders}
    assert "_include=MedicationRequest%3Amedication" in bundle["link"][0]["url"]
    bundle = fhir.search("Condition", {"patient": patient, "_revinclude": "Provenance:target"})
    served.append(bundle)
    conditions = {f"Condition/{e['resource']['id']}" for e in bundle["entry"] if e["search"]["mode"] == "match"}
    provenances = [e["resource"] for e in bundle["entry"] if e["search"]["mode"] == "include"]
    assert conditions and {t["reference"] for p in provenances for t in p["target"]} >= conditions
    assert all(p["resourceType"] == "Provenance" for p in provenances)
    assert fhir.ok(f"/Provenance/{provenances[0]['id']}") == provenances[0]

    # The growth chart app's call.
    assert resources(fhir.search("FamilyMemberHistory", {"patient": patient}))

    assert r4_invalid(served) == []
    assert r4_invalid([{**me, "birthDate": "1970-13-45"}])      # the validator does check


def test_a_patient_token_sees_its_compartment_only_includes_too(us_core_clinic, runtime, world):
    """With `patient/*.rs` and the launch's patient, every type answers that patient's resources
    only; another patient's search is empty; an include never discloses beyond the grant."""
    clinic = us_core_clinic
    live = clinic.fhir.base.split("/fhir/r4/")[0]
    org_id = clinic.fhir.base.rsplit("/", 1)[1]
    user = world.physician if clinic.kind == "sandbox" else None
    if user is None:
        from models.directory import User
        user = User.get((User.organization == org_id))
    token = mint_platform_token(runtime, live, user, world.app, org_id, scope="openid patient/*.rs launch",
                                patient=clinic.patient)
    fhir = Fhir(live, org_id, token)
    for kind in PATIENT_SHALL:
        mine = resources(fhir.search(kind, {"_count": 100}))
        assert mine and {of_patient(r) for r in mine} == {f"Patient/{clinic.patient}"}, kind
        assert resources(fhir.search(kind, {"patient": clinic.other_patient})) == [], kind
    bundle = fhir.search("Condition", {"_revinclude": "Provenance:target", "_include": "MedicationRequest:medication"})
    assert {r["resourceType"] for r in resources(bundle)} == {"Condition", "Provenance"}
    assert all(t["reference"] in {f"Condition/{r['id']}" for r in resources(bundle)} | {f"Patient/{clinic.patient}"}
               for r in resources(bundle) if r["resourceType"] == "Provenance" for t in r["target"])
    # Lenient: an unknown parameter is ignored (and left out of `self`), strict makes it a 400; a
    # malformed value of a served one is a 400 either way.
    bundle = fhir.search("Observation", {"category": "vital-signs", "_sort": "-date", "foo": "bar"})
    assert "_sort" not in bundle["link"][0]["url"] and "foo" not in bundle["link"][0]["url"]
    assert "category=vital-signs" in bundle["link"][0]["url"] and resources(bundle)
    status, _, body = fhir.get("/Observation", {"category": "vital-signs", "_sort": "-date"},
                               headers={"Prefer": "handling=strict"})
    assert status == 400 and "_sort" in body["issue"][0]["diagnostics"]
    for headers in ({}, {"Prefer": "handling=strict"}):
        status, _, body = fhir.get("/Observation", {"date": "yesterday"}, headers=headers)
        assert status == 400 and body["issue"][0]["code"] == "invalid"


def references_in(value) -> set[str]:
    """Every relative `Type/id` reference in a resource (at any depth)."""
    found = set()
    if isinstance(value, dict):
        ref = value.get("reference")
        if isinstance(ref, str) and re.fullmatch(r"[A-Z][A-Za-z]+/[A-Za-z0-9\-.]{1,64}", ref):
            found.add(ref)
        for item in value.values():
            found |= references_in(item)
    elif isinstance(value, list):
        for item in value:
            found |= references_in(item)
    return found


def test_the_demo_patient_reaches_every_us_core_type(runtime, world, live):
    """As a certification kit finds them: every US Core type from the documented demo patient (Lena
    Mercado, pat-b15c092f2447b7a2), by a search on the patient or a reference from her resources."""
    from helpers.fhir_api import ALL_TYPES
    from helpers.fhir_ehr import cli
    from connectors.us_core import SEARCH_PARAMS
    from models.directory import User
    seeded = json.loads(cli(runtime.settings, "demo", "seed", "--json").stdout)
    org_id, lena = seeded["organization_id"], "pat-b15c092f2447b7a2"
    set_fhir_rate_limits(runtime, world.app.id, fhir_rate_limit=Limit(100000, 60), fhir_token_rate_limit=Limit(100000, 60))
    install_application(world.app.id, org_id)
    fhir = Fhir(live, org_id, mint_platform_token(runtime, live, User.get_by_id(seeded["physician_user_id"]), world.app,
                                                  org_id))
    reached, references, served = {}, set(), []
    for kind in ALL_TYPES:
        if "patient" not in SEARCH_PARAMS[kind] and kind != "Patient":
            continue
        found = every_id(fhir, kind, {"_id": lena} if kind == "Patient" else {"patient": lena}, served)
        if found:
            reached[kind] = found[0]
    for bundle in served:
        references |= references_in([e["resource"] for e in bundle.get("entry", ())])
    for ref in sorted(references):
        kind = ref.split("/")[0]
        if kind not in reached:
            resource = fhir.ok(f"/{ref}")
            reached[kind] = resource["id"]
            served.append(resource)
    assert set(ALL_TYPES) - {"Appointment"} <= set(reached), sorted(set(ALL_TYPES) - set(reached))
    assert r4_invalid([r for r in served if r.get("resourceType") != "Bundle"] +
                      [b for b in served if b.get("resourceType") == "Bundle"][:10]) == []
