"""The one matcher (`connectors.matching`): the patient compartment, the date of a resource and
`matches(resource, ResourceQuery)`, as the sandbox's search, the FHIR API and the chart spool use it."""
from __future__ import annotations

import datetime as dt

from connectors import ResourceQuery
from connectors.fhir.query import SEARCH_DATE
from connectors.matching import DATE_ELEMENTS, date_of, day_of, in_compartment, matches, reference_id
from fhir_api.access import in_compartment as api_in_compartment
from fhir_api.search import SUPPORTED_TYPES

BASE = "https://ehr.example/fhir/R4"


def observation(subject: str, **fields) -> dict:
    return {"resourceType": "Observation", "id": "o-1", "subject": {"reference": subject}, **fields}


def test_references_name_the_patient_relatively_versioned_or_under_the_ehrs_own_base():
    for reference in ("Patient/p-1", "Patient/p-1/_history/3", f"{BASE}/Patient/p-1", f"{BASE}/Patient/p-1/_history/2"):
        assert reference_id(reference, "Patient", BASE) == "p-1", reference
        assert in_compartment(observation(reference), "p-1", BASE), reference
    for reference in ("Patient/p-10", "Patient/p-2", "Group/p-1", "", "#p-1", "urn:uuid:p-1", "Patient/",
                      "https://other-ehr.example/fhir/R4/Patient/p-1", f"{BASE}x/Patient/p-1", "Patient/p-1/extra"):
        assert not in_compartment(observation(reference), "p-1", BASE), reference
    # Without a base (the FHIR API: the connector made the EHR's own references relative), an absolute
    # URL is another server's; the FHIR API's rule is this one.
    for resource, expected in ((observation("Patient/p-1"), True), (observation(f"{BASE}/Patient/p-1"), False)):
        assert in_compartment(resource, "p-1") is expected and api_in_compartment(resource, "p-1") is expected
    appointment = {"resourceType": "Appointment", "participant": [{"actor": {"reference": "Practitioner/d"}},
                                                                  {"actor": {"reference": "Patient/p-1"}}]}
    allergy = {"resourceType": "AllergyIntolerance", "patient": {"reference": "Patient/p-1"}}
    assert in_compartment(appointment, "p-1") and in_compartment(allergy, "p-1")
    assert in_compartment({"resourceType": "Patient", "id": "p-1"}, "p-1")
    assert not in_compartment({"resourceType": "Patient", "id": "p-2"}, "p-1")
    assert not in_compartment({"resourceType": "Practitioner", "id": "p-1"}, "p-1")


def test_the_date_of_a_resource_is_one_definition():
    assert date_of({"resourceType": "Encounter", "period": {"start": "2024-03-05T09:30:00Z"}}) == "2024-03-05T09:30:00Z"
    assert date_of({"resourceType": "Observation", "effectivePeriod": {"start": "2024-03"}, "issued": "2025"}) == "2024-03"
    assert date_of({"resourceType": "Observation", "issued": "2024-03-05T10:00:00.123Z"}) == "2024-03-05T10:00:00.123Z"
    assert date_of({"resourceType": "Condition", "recordedDate": "2022-05-01"}) == "2022-05-01"
    assert date_of({"resourceType": "DocumentReference", "content": [{"attachment": {"creation": "2023-01-02"}}]}) \
        == "2023-01-02"
    assert date_of({"resourceType": "Patient", "birthDate": "1970-01-01"}) is None
    assert day_of({"resourceType": "Observation", "effectiveDateTime": "2024-03-01T23:30:00-05:00"}) == "2024-03-01"
    assert day_of({"resourceType": "Observation", "effectiveDateTime": "2024-03"}) == ""
    assert day_of({"resourceType": "Observation", "effectiveDateTime": "not a date"}) == ""
    # Every type the FHIR connector searches by date has a date here, and every type the API serves
    # that has a date is searched by it.
    assert set(SEARCH_DATE) <= set(DATE_ELEMENTS)
    assert {t for t in SUPPORTED_TYPES if t in DATE_ELEMENTS} <= set(SEARCH_DATE)


def test_a_date_range_matches_what_overlaps_it():
    query = ResourceQuery("Observation", start=dt.datetime(2024, 3, 5), end=dt.datetime(2024, 3, 6))
    for effective, expected in (("2024-03-05", True), ("2024-03", True), ("2024", True), ("2024-03-04", False),
                                ("2024-03-06", False), ("2024-03-05T23:59:59Z", True), ("2024-03-06T00:00:00Z", False),
                                ("2024-03-05T20:00:00-05:00", False), ("2024-03-06T01:00:00+02:00", True),
                                # not FHIR dates (Arabic-Indic digits, a trailing newline): no date, no match
                                ("\u0662\u0660\u0662\u0664-03-05", False), ("2024-03-05\n", False)):
        assert matches(observation("Patient/p", effectiveDateTime=effective), query) is expected, effective
    assert not matches(observation("Patient/p"), query)            # a range, and no date: no match
    assert matches(observation("Patient/p"), ResourceQuery("Observation"))
    stay = {"resourceType": "Encounter", "period": {"start": "2024-03-01", "end": "2024-03-07"}}
    assert matches(stay, ResourceQuery("Encounter", start=dt.datetime(2024, 3, 5)))   # still there on the 5th


def test_a_query_matches_only_what_each_of_its_fields_says():
    doc = {"resourceType": "Practitioner", "id": "d-1",
           "identifier": [{"system": "http://hl7.org/fhir/sid/us-npi", "value": "1234567893"}]}
    assert matches(doc, ResourceQuery("Practitioner", npi="1234567893"))
    assert not matches(doc, ResourceQuery("Practitioner", npi="1245319599"))
    assert not matches({**doc, "identifier": [{"system": "urn:other", "value": "1234567893"}]},
                       ResourceQuery("Practitioner", npi="1234567893"))
    assert matches(doc, ResourceQuery("Practitioner", practitioner="d-1", ids=("d-1", "d-2")))
    assert not matches(doc, ResourceQuery("Practitioner", patient="p-1"))        # outside any compartment
    assert not matches(doc, ResourceQuery("Patient"))                             # another type
    visit = {"resourceType": "Appointment", "id": "a", "start": "2026-03-02T14:00:00Z",
             "participant": [{"actor": {"reference": "Patient/p-1"}}, {"actor": {"reference": "Practitioner/d-1"}}]}
    assert matches(visit, ResourceQuery("Appointment", patient="p-1", practitioner="d-1",
                                        start=dt.datetime(2026, 3, 2, 14), end=dt.datetime(2026, 3, 2, 15)))
    assert not matches(visit, ResourceQuery("Appointment", practitioner="d-2"))
    assert not matches(visit, ResourceQuery("Appointment", npi="1234567893"))
    assert not matches(visit, ResourceQuery("Appointment", start=dt.datetime(2026, 3, 2, 14, 0, 1)))
    assert not matches(visit, ResourceQuery("Appointment", ids=("b",)))
