"""Connector data as FHIR R4 JSON in US Core shapes: the one place that renders resources.

The sandbox connector answers the platform FHIR API (`read_resource`, `search_resources`) with
these. Every resource carries `meta.profile` of its US Core (6.1) profile, except Appointment,
which US Core does not profile. References are relative (`Patient/{id}`); ids are given verbatim.
"""
from __future__ import annotations

import datetime as dt
import re

from connectors.base import Appointment, Encounter, Patient, fhir_status
from models.npi import NPI_SYSTEM

ICD10_SYSTEM = "http://hl7.org/fhir/sid/icd-10-cm"
LOINC = "http://loinc.org"
UCUM = "http://unitsofmeasure.org"
US_CORE = "http://hl7.org/fhir/us/core/StructureDefinition/"
CLINICAL_STATUS = "http://terminology.hl7.org/CodeSystem/condition-clinical"
VERIFICATION_STATUS = "http://terminology.hl7.org/CodeSystem/condition-ver-status"
ALLERGY_CLINICAL = "http://terminology.hl7.org/CodeSystem/allergyintolerance-clinical"
ALLERGY_VERIFICATION = "http://terminology.hl7.org/CodeSystem/allergyintolerance-verification"
CONDITION_CATEGORY = "http://terminology.hl7.org/CodeSystem/condition-category"
OBSERVATION_CATEGORY = "http://terminology.hl7.org/CodeSystem/observation-category"
ACT_CODE = "http://terminology.hl7.org/CodeSystem/v3-ActCode"
PARTICIPATION_TYPE = "http://terminology.hl7.org/CodeSystem/v3-ParticipationType"
VITALS = (
    # (key in Encounter.vitals, id suffix, LOINC code, display, US Core profile, UCUM unit)
    ("blood_pressure", "bp", "85354-9", "Blood pressure panel with all children optional", "us-core-blood-pressure",
     "mm[Hg]"),
    ("heart_rate", "hr", "8867-4", "Heart rate", "us-core-heart-rate", "/min"),
    ("temperature", "temp", "8310-5", "Body temperature", "us-core-body-temperature", "Cel"),
    ("weight", "wt", "29463-7", "Body weight", "us-core-body-weight", "kg"),
)
VITAL_SUFFIXES = tuple(v[1] for v in VITALS)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _meta(profile: str | None) -> dict:
    return {"meta": {"profile": [US_CORE + profile]}} if profile else {}


def _ref(resource_type: str, resource_id: str, display: str | None = None) -> dict:
    ref = {"reference": f"{resource_type}/{resource_id}"}
    if display:
        ref["display"] = display
    return ref


def _instant(value: dt.datetime) -> str:
    """A naive UTC datetime as a FHIR instant."""
    return value.replace(microsecond=0).isoformat() + "Z"


def _coding(system: str, code: str, display: str | None = None) -> dict:
    coding = {"system": system, "code": code}
    if display:
        coding["display"] = display
    return coding


def patient(p: Patient, identifier_system: str) -> dict:
    """US Core Patient: an identifier (the clinic's record number system), name, gender, birth date."""
    return {"resourceType": "Patient", "id": p.id, **_meta("us-core-patient"),
            "identifier": [{"system": identifier_system, "value": p.id}],
            "name": [{"use": "official", "family": p.last_name, "given": [p.first_name]}],
            "gender": p.sex if p.sex in ("male", "female", "other", "unknown") else "unknown",
            "birthDate": p.date_of_birth.isoformat()}


def practitioner(practitioner_id: str, given: str | None, family: str | None, npi: str | None) -> dict:
    """US Core Practitioner with the NPI identifier."""
    name = {"family": family} if family else {}
    if given:
        name["given"] = [given]
    resource = {"resourceType": "Practitioner", "id": practitioner_id, **_meta("us-core-practitioner"),
                "name": [{**name, "prefix": ["Dr."]}]}
    if npi:
        resource["identifier"] = [{"system": NPI_SYSTEM, "value": npi}]
    return resource


def appointment(a: Appointment, practitioner_id: str, practitioner_name: str) -> dict:
    """An Appointment of a patient with a practitioner (US Core has no Appointment profile)."""
    return {"resourceType": "Appointment", "id": a.id,
            "status": fhir_status(a.status),
            "appointmentType": {"text": a.appointment_type},
            "reasonCode": [{"text": a.reason}],
            "start": _instant(a.start), "end": _instant(a.end),
            "minutesDuration": int((a.end - a.start).total_seconds() // 60),
            "participant": [
                {"actor": _ref("Patient", a.patient.id, f"{a.patient.first_name} {a.patient.last_name}"),
                 "required": "required", "status": "accepted"},
                {"type": [{"coding": [_coding(PARTICIPATION_TYPE, "PPRF", "primary performer")]}],
                 "actor": _ref("Practitioner", practitioner_id, practitioner_name),
                 "required": "required", "status": "accepted"},
                {"actor": {"display": a.location}, "required": "information-only", "status": "accepted"}]}


def encounter(encounter_id: str, patient_id: str, e: Encounter) -> dict:
    """US Core Encounter: a finished ambulatory visit on its day."""
    return {"resourceType": "Encounter", "id": encounter_id, **_meta("us-core-encounter"),
            "status": "finished",
            "class": _coding(ACT_CODE, "VR" if e.encounter_type == "Telehealth" else "AMB",
                             "virtual" if e.encounter_type == "Telehealth" else "ambulatory"),
            "type": [{"text": e.encounter_type}],
            "subject": _ref("Patient", patient_id),
            "participant": [{"individual": {"display": e.provider}}],
            "period": {"start": e.date.isoformat(), "end": e.date.isoformat()},
            "reasonCode": [{"text": e.reason}]}


def condition(condition_id: str, patient_id: str, problem: dict) -> dict:
    """US Core Condition (problem list item), ICD-10-CM coded, active."""
    return {"resourceType": "Condition", "id": condition_id,
            **_meta("us-core-condition-problems-health-concerns"),
            "clinicalStatus": {"coding": [_coding(CLINICAL_STATUS, "active", "Active")]},
            "verificationStatus": {"coding": [_coding(VERIFICATION_STATUS, "confirmed", "Confirmed")]},
            "category": [{"coding": [_coding(CONDITION_CATEGORY, "problem-list-item", "Problem List Item")]}],
            "code": {"coding": [_coding(ICD10_SYSTEM, problem["code"], problem["description"])],
                     "text": problem["description"]},
            "subject": _ref("Patient", patient_id),
            "onsetDateTime": problem["onset"]}


def _quantity(text: str, unit: str) -> dict | None:
    match = _NUMBER.search(text or "")
    return {"value": _number(match.group()), "unit": unit, "system": UCUM, "code": unit} if match else None


def _number(text: str):
    """A measured value as written: an integer stays one (72, not 72.0)."""
    return float(text) if "." in text else int(text)


def observations(id_prefix: str, patient_id: str, encounter_id: str, e: Encounter) -> list[dict]:
    """US Core vital signs of one encounter, LOINC coded: one Observation per measured vital,
    with ids `{id_prefix}-{suffix}` (suffix from VITALS)."""
    found = []
    for key, suffix, code, display, profile, unit in VITALS:
        text = (e.vitals or {}).get(key)
        if not text:
            continue
        resource = {"resourceType": "Observation", "id": f"{id_prefix}-{suffix}", **_meta(profile),
                    "status": "final",
                    "category": [{"coding": [_coding(OBSERVATION_CATEGORY, "vital-signs", "Vital Signs")]}],
                    "code": {"coding": [_coding(LOINC, code, display)], "text": display},
                    "subject": _ref("Patient", patient_id), "encounter": _ref("Encounter", encounter_id),
                    "effectiveDateTime": e.date.isoformat()}
        if key == "blood_pressure":
            values = _NUMBER.findall(text)
            if len(values) < 2:
                continue
            resource["component"] = [
                {"code": {"coding": [_coding(LOINC, "8480-6", "Systolic blood pressure")]},
                 "valueQuantity": {"value": _number(values[0]), "unit": unit, "system": UCUM, "code": unit}},
                {"code": {"coding": [_coding(LOINC, "8462-4", "Diastolic blood pressure")]},
                 "valueQuantity": {"value": _number(values[1]), "unit": unit, "system": UCUM, "code": unit}}]
        else:
            quantity = _quantity(text, unit)
            if quantity is None:
                continue
            resource["valueQuantity"] = quantity
        found.append(resource)
    return found


def medication_request(request_id: str, patient_id: str, medication: dict) -> dict:
    """US Core MedicationRequest: an active order with its dose and frequency as text."""
    return {"resourceType": "MedicationRequest", "id": request_id, **_meta("us-core-medicationrequest"),
            "status": "active", "intent": "order",
            "medicationCodeableConcept": {"text": f"{medication['name']} {medication['dose']}"},
            "subject": _ref("Patient", patient_id),
            "authoredOn": medication.get("started"),
            "dosageInstruction": [{"text": f"{medication['dose']} {medication['frequency']}"}]}


def allergy_intolerance(allergy_id: str, patient_id: str, allergy: dict) -> dict:
    """US Core AllergyIntolerance: active, confirmed, with its reaction and severity."""
    severity = allergy.get("severity")
    reaction = {"manifestation": [{"text": allergy.get("reaction") or "unknown"}]}
    if severity in ("mild", "moderate", "severe"):
        reaction["severity"] = severity
    return {"resourceType": "AllergyIntolerance", "id": allergy_id, **_meta("us-core-allergyintolerance"),
            "clinicalStatus": {"coding": [_coding(ALLERGY_CLINICAL, "active", "Active")]},
            "verificationStatus": {"coding": [_coding(ALLERGY_VERIFICATION, "confirmed", "Confirmed")]},
            "code": {"text": allergy["substance"]},
            "patient": _ref("Patient", patient_id),
            "reaction": [reaction]}
