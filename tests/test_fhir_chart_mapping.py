"""A FHIR chart's entries from US Core-shaped resources (connectors.fhir.spool), and its spool."""
from __future__ import annotations

import datetime as dt

import pytest

from connectors.fhir.mapping import Unlisted, patient_of
from connectors.fhir.spool import ChartSpool, document_of, observation_of

LOINC = "http://loinc.org"


def observation(**fields) -> dict:
    return {"resourceType": "Observation", "id": "o", "status": "final", "subject": {"reference": "Patient/p-1"},
            "code": {"coding": [{"system": LOINC, "code": "1234-5", "display": "Thing"}]}, **fields}


def test_observation_values_and_units_as_text():
    def value(**fields) -> tuple[str, str]:
        mapped = observation_of(observation(**fields))
        return mapped["value"], mapped["unit"]

    assert value(valueQuantity={"value": 7.1, "unit": "%"}) == ("7.1", "%")
    assert value(valueQuantity={"value": 98.0, "code": "[degF]"}) == ("98.0", "[degF]")   # the unit's code
    assert value(valueCodeableConcept={"coding": [{"code": "260385009", "display": "Negative"}]}) == ("Negative", "")
    assert value(valueString="trace") == ("trace", "")
    assert value(valueBoolean=False) == ("false", "")
    assert value(valueInteger=3) == ("3", "")
    assert value(valueRange={"low": {"value": 1, "unit": "mg"}, "high": {"value": 2, "unit": "mg"}}) == ("1-2", "mg")
    assert value(dataAbsentReason={"text": "Patient refused"}) == ("(Patient refused)", "")
    bp = [{"code": {"text": "Systolic"}, "valueQuantity": {"value": 120, "unit": "mm[Hg]"}},
          {"code": {"text": "Diastolic"}, "valueQuantity": {"value": 80, "unit": "mm[Hg]"}}]
    assert value(component=bp) == ("120/80", "mm[Hg]")
    mixed = [{"code": {"text": "Rate"}, "valueQuantity": {"value": 16, "unit": "/min"}},
             {"code": {"text": "Effort"}, "valueCodeableConcept": {"text": "normal"}}]
    assert value(component=mixed) == ("Rate 16 /min; Effort normal", "")
    assert observation_of(observation(effectivePeriod={"start": "2024-05-06T07:00:00Z"}))["date"] == "2024-05-06"
    assert observation_of(observation(issued="2024-05-07T07:00:00Z"))["date"] == "2024-05-07"


def test_a_document_is_described_never_copied():
    reference = {"resourceType": "DocumentReference", "id": "d", "status": "superseded",
                 "description": "Echo report", "type": {"text": "Cardiology note"},
                 "context": {"period": {"start": "2023-01-02T03:04:05Z"}},
                 "content": [{"attachment": {"contentType": "application/pdf", "data": "JVBERi0xLjQK",
                                             "url": "https://ehr.example/Binary/secret"}}]}
    described = document_of(reference)
    assert described == {"id": "d", "date": "2023-01-02", "title": "Echo report", "type": "Cardiology note",
                         "category": "", "status": "superseded", "content_type": "application/pdf"}


def test_the_spool_keeps_only_the_patients_resources_and_streams_them_back_to_several_readers():
    spool = ChartSpool("p-1", "https://ehr.example/fhir/R4")  # the EHR's base: its absolute references are its own
    for n, reference in enumerate(("Patient/p-1", "https://ehr.example/fhir/R4/Patient/p-1",
                                   "Patient/p-1/_history/3", "Patient/p-10", "Patient/p-2", "Group/p-1", "",
                                   "https://other-ehr.example/fhir/R4/Patient/p-1")):
        spool.add(observation(id=f"o-{n}", subject={"reference": reference}, valueQuantity={"value": n}))
    spool.add({"resourceType": "AllergyIntolerance", "id": "a", "patient": {"reference": "Patient/p-1"},
               "code": {"text": "Latex"}})
    spool.add({"resourceType": "Encounter", "id": "e-undated", "subject": {"reference": "Patient/p-1"}})
    spool.add({"resourceType": "Encounter", "id": "e", "subject": {"reference": "Patient/p-1"},
               "period": {"start": "2024-01-02T09:00:00Z"}, "type": [{"text": "Office visit"}]})
    spool.add({"resourceType": "Appointment", "id": "x", "participant": []})   # not part of a chart
    assert spool.left_out == 5 and [a["substance"] for a in spool.allergies] == ["Latex"]
    assert spool.counts == {"problems": 0, "medications": 0, "allergies": 1, "encounters": 1, "observations": 3,
                            "documents": 0}
    first, second = spool.read("observations"), spool.read("observations")
    assert next(first)["id"] == "o-0" and next(second)["id"] == "o-0"          # each reader has its place
    assert [o["id"] for o in first] == ["o-1", "o-2"] and [o["id"] for o in second] == ["o-1", "o-2"]
    spool.add(observation(id="o-late", valueQuantity={"value": 9}))            # appends after a read
    assert [o["id"] for o in spool.read("observations")] == ["o-0", "o-1", "o-2", "o-late"]
    [encounter] = spool.read("encounters")
    assert (encounter.id, encounter.date, encounter.encounter_type) == ("e", dt.date(2024, 1, 2), "Office visit")
    spool.close()


def test_a_birth_date_is_read_by_the_fhir_date_grammar():
    """A birthDate is a FHIR date (`models.fhir_grammar`): a day shaped otherwise (an ISO week date,
    which Python's own parser takes, Arabic-Indic digits, an impossible day) is no birthDate."""
    def born(birth):
        return patient_of({"resourceType": "Patient", "id": "p-1", "birthDate": birth}).date_of_birth

    assert born("1970-01-02") == dt.date(1970, 1, 2)
    assert born("1970-01") is None and born("1970") is None and born("") is None  # not a whole day: none
    for impossible in ("1970-02-30", "1970-W01-1", "\u0661\u0669\u0667\u0660-01-02", "1970/01/02"):
        with pytest.raises(Unlisted):
            born(impossible)
