"""Connector data as FHIR R4 JSON in US Core shapes: the one place that renders resources.

The sandbox connector answers the platform FHIR API (`read_resource`, `search_resources`) with
these. Every resource carries `meta.profile` of its US Core (6.1) profile, except Appointment,
which US Core does not profile. References are relative (`Patient/{id}`); ids are given verbatim.
"""
from __future__ import annotations

import base64
import datetime as dt
import html
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


def encounter(encounter_id: str, patient_id: str, e: Encounter, identifier_system: str,
              location_id: str | None = None) -> dict:
    """US Core Encounter: a finished ambulatory visit on its day (its id, in the clinic's system, its
    identifier), at the clinic's Location."""
    return {"resourceType": "Encounter", "id": encounter_id, **_meta("us-core-encounter"),
            "identifier": [{"system": identifier_system, "value": encounter_id}], "status": "finished",
            "class": _coding(ACT_CODE, "VR" if e.encounter_type == "Telehealth" else "AMB",
                             "virtual" if e.encounter_type == "Telehealth" else "ambulatory"),
            "type": [{"text": e.encounter_type}],
            "subject": _ref("Patient", patient_id),
            "participant": [{"individual": {"display": e.provider}}],
            "period": {"start": e.date.isoformat(), "end": e.date.isoformat()},
            "reasonCode": [{"text": e.reason}],
            **({"location": [{"location": _ref("Location", location_id)}]} if location_id else {})}


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


def medication_request(request_id: str, patient_id: str, medication: dict, medication_id: str) -> dict:
    """US Core MedicationRequest: an active order of a catalogue Medication, its dose and frequency as text."""
    return {"resourceType": "MedicationRequest", "id": request_id, **_meta("us-core-medicationrequest"),
            "status": "active", "intent": "order", "reportedBoolean": False,
            "medicationReference": _ref("Medication", medication_id, f"{medication['name']} {medication['dose']}"),
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


# -- the rest of US Core 6.1 (the sandbox's `us_core_record`, its clinic and catalogue) -----------
SNOMED = "http://snomed.info/sct"
CVX = "http://hl7.org/fhir/sid/cvx"
ROLE_CODE = "http://terminology.hl7.org/CodeSystem/v3-RoleCode"
DIAGNOSTIC_SERVICE = "http://terminology.hl7.org/CodeSystem/v2-0074"
DOCUMENT_CATEGORY = "http://hl7.org/fhir/us/core/CodeSystem/us-core-documentreference-category"
CARE_PLAN_CATEGORY = "http://hl7.org/fhir/us/core/CodeSystem/careplan-category"
PROVENANCE_ROLE = "http://terminology.hl7.org/CodeSystem/provenance-participant-type"
SUBSCRIBER_RELATIONSHIP = "http://terminology.hl7.org/CodeSystem/subscriber-relationship"
COVERAGE_TYPE = "https://nahdo.org/sopt"
NUCC = "http://nucc.org/provider-taxonomy"


def _clinic_address() -> dict:
    """The sandbox clinic's address (a new dict each time: resources never share one)."""
    return {"line": ["100 Main Street"], "city": "Springfield", "state": "MA", "postalCode": "01103", "country": "US"}


def _noon(day: str) -> str:
    """A day as the instant at noon UTC (elements typed `instant`)."""
    return f"{day}T12:00:00Z"


def _text_div(text: str) -> dict:
    return {"status": "generated", "div": f'<div xmlns="http://www.w3.org/1999/xhtml">{html.escape(text)}</div>'}


def organization(organization_id: str, name: str) -> dict:
    """US Core Organization: the clinic."""
    return {"resourceType": "Organization", "id": organization_id, **_meta("us-core-organization"), "active": True,
            "identifier": [{"system": "urn:svc-auth:organization", "value": organization_id}], "name": name,
            "telecom": [{"system": "phone", "value": "555-0100", "use": "work"}], "address": [_clinic_address()]}


def location(location_id: str, organization_id: str, name: str) -> dict:
    """US Core Location: the clinic's building."""
    return {"resourceType": "Location", "id": location_id, **_meta("us-core-location"), "status": "active",
            "name": name, "address": _clinic_address(), "managingOrganization": _ref("Organization", organization_id)}


def practitioner_role(role_id: str, practitioner_id: str, organization_id: str, location_id: str) -> dict:
    """US Core PractitionerRole: a physician of the clinic, in family medicine."""
    specialty = [{"coding": [_coding(NUCC, "207Q00000X", "Family Medicine Physician")]}]
    return {"resourceType": "PractitionerRole", "id": role_id, **_meta("us-core-practitionerrole"), "active": True,
            "practitioner": _ref("Practitioner", practitioner_id), "organization": _ref("Organization", organization_id),
            "code": specialty, "specialty": specialty, "location": [_ref("Location", location_id)]}


def medication(medication_id: str, name: str, dose: str) -> dict:
    """US Core Medication: a product of the catalogue, by name and strength."""
    return {"resourceType": "Medication", "id": medication_id, **_meta("us-core-medication"),
            "code": {"text": f"{name} {dose}"}, "status": "active"}


def immunization(immunization_id: str, patient_id: str, code: str, text: str, day: str) -> dict:
    return {"resourceType": "Immunization", "id": immunization_id, **_meta("us-core-immunization"),
            "status": "completed", "vaccineCode": {"coding": [_coding(CVX, code, text)], "text": text},
            "patient": _ref("Patient", patient_id), "occurrenceDateTime": day, "primarySource": True}


def procedure(procedure_id: str, patient_id: str, code: str, text: str, day: str) -> dict:
    return {"resourceType": "Procedure", "id": procedure_id, **_meta("us-core-procedure"), "status": "completed",
            "code": {"coding": [_coding(SNOMED, code, text)], "text": text}, "subject": _ref("Patient", patient_id),
            "performedDateTime": day}


def device(device_id: str, patient_id: str, code: str, text: str) -> dict:
    return {"resourceType": "Device", "id": device_id, **_meta("us-core-implantable-device"), "status": "active",
            "type": {"coding": [_coding(SNOMED, code, text)], "text": text}, "patient": _ref("Patient", patient_id)}


def goal(goal_id: str, patient_id: str, text: str, due: str) -> dict:
    return {"resourceType": "Goal", "id": goal_id, **_meta("us-core-goal"), "lifecycleStatus": "active",
            "description": {"text": text}, "subject": _ref("Patient", patient_id), "target": [{"dueDate": due}]}


def service_request(request_id: str, patient_id: str, code: str, text: str, day: str) -> dict:
    return {"resourceType": "ServiceRequest", "id": request_id, **_meta("us-core-servicerequest"),
            "status": "completed", "intent": "order",
            "category": [{"coding": [_coding(SNOMED, "108252007", "Laboratory procedure")]}],
            "code": {"coding": [_coding(LOINC, code, text)], "text": text}, "subject": _ref("Patient", patient_id),
            "authoredOn": day}


def specimen(specimen_id: str, patient_id: str, request_id: str, day: str) -> dict:
    return {"resourceType": "Specimen", "id": specimen_id, **_meta("us-core-specimen"),
            "identifier": [{"system": "urn:svc-auth:specimen", "value": specimen_id}],
            "type": {"coding": [_coding(SNOMED, "119297000", "Blood specimen")]}, "subject": _ref("Patient", patient_id),
            "request": [_ref("ServiceRequest", request_id)], "collection": {"collectedDateTime": day}}


def diagnostic_report(report_id: str, patient_id: str, organization_id: str, code: str, text: str, day: str,
                      request_id: str, specimen_id: str) -> dict:
    """US Core DiagnosticReport for laboratory results (its order and specimen referenced)."""
    return {"resourceType": "DiagnosticReport", "id": report_id, **_meta("us-core-diagnosticreport-lab"),
            "basedOn": [_ref("ServiceRequest", request_id)], "status": "final",
            "category": [{"coding": [_coding(DIAGNOSTIC_SERVICE, "LAB", "Laboratory")]}],
            "code": {"coding": [_coding(LOINC, code, text)], "text": text}, "subject": _ref("Patient", patient_id),
            "effectiveDateTime": day, "issued": _noon(day), "performer": [_ref("Organization", organization_id)],
            "specimen": [_ref("Specimen", specimen_id)]}


def document_reference(document_id: str, patient_id: str, organization_id: str, text: str, day: str) -> dict:
    """US Core DocumentReference: the clinical note of a lab report, as plain text."""
    note = f"{text}: results reviewed with the patient on {day}."
    return {"resourceType": "DocumentReference", "id": document_id, **_meta("us-core-documentreference"),
            "status": "current", "type": {"coding": [_coding(LOINC, "11502-2", "Laboratory report")]},
            "category": [{"coding": [_coding(DOCUMENT_CATEGORY, "clinical-note", "Clinical Note")]}],
            "subject": _ref("Patient", patient_id), "date": _noon(day), "author": [_ref("Organization", organization_id)],
            "content": [{"attachment": {"contentType": "text/plain", "title": text,
                                        "data": base64.b64encode(note.encode()).decode()}}],
            "context": {"period": {"start": day}}}


def family_member_history(history_id: str, patient_id: str, relative: tuple, condition: tuple) -> dict:
    (role, role_text), (code, text) = relative, condition
    return {"resourceType": "FamilyMemberHistory", "id": history_id, "status": "completed",
            "patient": _ref("Patient", patient_id), "relationship": {"coding": [_coding(ROLE_CODE, role, role_text)]},
            "condition": [{"code": {"coding": [_coding(SNOMED, code, text)], "text": text}}]}


def related_person(person_id: str, patient_id: str, relative: tuple, given: str, family: str) -> dict:
    role, role_text = relative
    return {"resourceType": "RelatedPerson", "id": person_id, **_meta("us-core-relatedperson"), "active": True,
            "patient": _ref("Patient", patient_id), "relationship": [{"coding": [_coding(ROLE_CODE, role, role_text)]}],
            "name": [{"family": family, "given": [given]}]}


def coverage(coverage_id: str, patient_id: str, payer: str, member: str, start: str) -> dict:
    return {"resourceType": "Coverage", "id": coverage_id, **_meta("us-core-coverage"), "status": "active",
            "type": {"coding": [_coding(COVERAGE_TYPE, "5", "Private Health Insurance")]},
            "subscriberId": member, "beneficiary": _ref("Patient", patient_id),
            "relationship": {"coding": [_coding(SUBSCRIBER_RELATIONSHIP, "self", "Self")]},
            "period": {"start": start}, "payor": [{"display": payer}]}


def care_plan(plan_id: str, patient_id: str, text: str, start: str) -> dict:
    return {"resourceType": "CarePlan", "id": plan_id, **_meta("us-core-careplan"), "text": _text_div(text),
            "status": "active", "intent": "plan",
            "category": [{"coding": [_coding(CARE_PLAN_CATEGORY, "assess-plan", "Assessment and Plan of Treatment")]}],
            "subject": _ref("Patient", patient_id), "period": {"start": start}}


def care_team(team_id: str, patient_id: str, organization_id: str, practitioner_id: str | None = None,
              role_id: str | None = None, related_id: str | None = None) -> dict:
    """US Core CareTeam: the patient, the clinic, its physician (as a Practitioner and in their
    PractitionerRole) and the patient's related person (US Core's member types)."""
    professional = [{"coding": [_coding(SNOMED, "223366009", "Healthcare professional")]}]
    members = [{"role": [{"coding": [_coding(SNOMED, "116154003", "Patient")]}], "member": _ref("Patient", patient_id)},
               {"role": professional, "member": _ref("Organization", organization_id)}]
    if practitioner_id:
        members.append({"role": [{"coding": [_coding(SNOMED, "309343006", "Physician")]}],
                        "member": _ref("Practitioner", practitioner_id)})
    if role_id:
        members.append({"role": professional, "member": _ref("PractitionerRole", role_id)})
    if related_id:
        members.append({"role": [{"coding": [_coding(SNOMED, "133932002", "Caregiver")]}],
                        "member": _ref("RelatedPerson", related_id)})
    return {"resourceType": "CareTeam", "id": team_id, **_meta("us-core-careteam"), "status": "active",
            "name": "Primary care team", "subject": _ref("Patient", patient_id), "participant": members}


def questionnaire_response(response_id: str, patient_id: str, scores: list[int], day: str) -> dict:
    """A PHQ-2 answered (US Core QuestionnaireResponse)."""
    items = (("44250-9", "Little interest or pleasure in doing things"), ("44255-8", "Feeling down, depressed, or hopeless"))
    return {"resourceType": "QuestionnaireResponse", "id": response_id, **_meta("us-core-questionnaireresponse"),
            "questionnaire": "http://loinc.org/q/55757-9", "status": "completed", "subject": _ref("Patient", patient_id),
            "authored": day, "item": [{"linkId": code, "text": text, "answer": [{"valueInteger": score}]}
                                      for (code, text), score in zip(items, scores)]}


def medication_dispense(dispense_id: str, patient_id: str, medication_id: str, request_id: str, day: str | None) -> dict:
    resource = {"resourceType": "MedicationDispense", "id": dispense_id, **_meta("us-core-medicationdispense"),
                "status": "completed", "medicationReference": _ref("Medication", medication_id),
                "subject": _ref("Patient", patient_id), "authorizingPrescription": [_ref("MedicationRequest", request_id)]}
    if day:
        resource["whenHandedOver"] = day
    return resource


def provenance(provenance_id: str, patient_id: str, target: dict, organization_id: str, day: str) -> dict:
    """US Core Provenance of one resource of the patient's record (and so of the patient): the
    clinic authored it, recorded on `day`."""
    return {"resourceType": "Provenance", "id": provenance_id, **_meta("us-core-provenance"),
            "target": [_ref(target["resourceType"], target["id"]), _ref("Patient", patient_id)],
            "recorded": _noon(day),
            "agent": [{"type": {"coding": [_coding(PROVENANCE_ROLE, "author", "Author")]},
                       "who": _ref("Organization", organization_id), "onBehalfOf": _ref("Organization", organization_id)}]}
