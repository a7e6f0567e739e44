"""US Core 6.1 as data: the types the FHIR API serves, their profiles, and their search parameters.

`SEARCH_PARAMS[type][name]` is `(kind, paths)`: the FHIR search parameter type (`token`, `string`,
`date`, `reference`) and the elements it reads, in order, as paths into the resource (through lists
at any step); for a `date`, the first element present is the resource's. Every US Core 6.1 SHALL
search parameter of the type is here (and a few of its SHOULDs), with R4's meaning; `_id` and the
patient (`patient`, `subject`) are the neutral query's own fields. One table for the parser
(`fhir_api.search`), the matcher (`connectors.matching`), the FHIR connector's translation
(`connectors.fhir.query`) and the CapabilityStatement (`fhir_api.capability`).
"""
from __future__ import annotations

from types import MappingProxyType

US_CORE_SERVER = "http://hl7.org/fhir/us/core/CapabilityStatement/us-core-server"
US_CORE_PROFILE = "http://hl7.org/fhir/us/core/StructureDefinition/"

_PATIENT = (("patient", "reference", ()),)
_STATUS = ("status", "token", (("status",),))
_CATEGORY = ("category", "token", (("category",),))
_CODE = ("code", "token", (("code",),))
_LAST_UPDATED = ("_lastUpdated", "date", (("meta", "lastUpdated"),))


def _params(*rows) -> MappingProxyType:
    return MappingProxyType({name: (kind, paths) for name, kind, paths in rows})


SEARCH_PARAMS = MappingProxyType({
    "AllergyIntolerance": _params(*_PATIENT, ("clinical-status", "token", (("clinicalStatus",),))),
    "Appointment": _params(*_PATIENT, ("practitioner", "reference", ()), ("actor", "reference", ()),
                           ("date", "date", (("start",),)), _STATUS),
    "CarePlan": _params(*_PATIENT, _CATEGORY, _STATUS, ("date", "date", (("period",),))),
    "CareTeam": _params(*_PATIENT, _STATUS, ("role", "token", (("participant", "role"),))),
    "Condition": _params(*_PATIENT, ("subject", "reference", ()), _CATEGORY, _CODE,
                         ("clinical-status", "token", (("clinicalStatus",),)),
                         ("onset-date", "date", (("onsetDateTime",), ("onsetPeriod",))),
                         ("recorded-date", "date", (("recordedDate",),)),
                         ("abatement-date", "date", (("abatementDateTime",), ("abatementPeriod",))),
                         ("encounter", "reference", (("encounter",),))),
    "Coverage": _params(*_PATIENT),
    "Device": _params(*_PATIENT, ("type", "token", (("type",),)), _STATUS),
    "DiagnosticReport": _params(*_PATIENT, ("subject", "reference", ()), _CATEGORY, _CODE, _STATUS,
                                ("date", "date", (("effectiveDateTime",), ("effectivePeriod",))), _LAST_UPDATED),
    "DocumentReference": _params(*_PATIENT, ("subject", "reference", ()), _CATEGORY, _STATUS,
                                 ("type", "token", (("type",),)), ("date", "date", (("date",),)),
                                 ("period", "date", (("context", "period"),))),
    "Encounter": _params(*_PATIENT, ("subject", "reference", ()), ("identifier", "token", (("identifier",),)),
                         ("date", "date", (("period",),)), ("class", "token", (("class",),)),
                         ("type", "token", (("type",),)), _STATUS,
                         ("location", "reference", (("location", "location"),))),
    "FamilyMemberHistory": _params(*_PATIENT, ("code", "token", (("condition", "code"),)), _STATUS,
                                   ("relationship", "token", (("relationship",),))),
    "Goal": _params(*_PATIENT, ("lifecycle-status", "token", (("lifecycleStatus",),)),
                    ("target-date", "date", (("target", "dueDate"),)), ("description", "token", (("description",),))),
    "Immunization": _params(*_PATIENT, _STATUS, ("date", "date", (("occurrenceDateTime",),))),
    "Location": _params(("name", "string", (("name",), ("alias",))), ("address", "string", (("address",),)),
                        ("address-city", "string", (("address", "city"),)),
                        ("address-state", "string", (("address", "state"),)),
                        ("address-postalcode", "string", (("address", "postalCode"),))),
    "Medication": _params(_CODE),
    "MedicationDispense": _params(*_PATIENT, _STATUS, ("type", "token", (("type",),))),
    "MedicationRequest": _params(*_PATIENT, ("subject", "reference", ()), ("intent", "token", (("intent",),)),
                                 _STATUS, ("authoredon", "date", (("authoredOn",),)),
                                 ("encounter", "reference", (("encounter",),))),
    "Observation": _params(*_PATIENT, ("subject", "reference", ()), _CATEGORY, _CODE, _STATUS,
                           ("date", "date", (("effectiveDateTime",), ("effectivePeriod",), ("effectiveInstant",))),
                           _LAST_UPDATED),
    "Organization": _params(("name", "string", (("name",), ("alias",))), ("address", "string", (("address",),))),
    "Patient": _params(("identifier", "token", (("identifier",),)), ("name", "string", (("name",),)),
                       ("family", "string", (("name", "family"),)), ("given", "string", (("name", "given"),)),
                       ("birthdate", "date", (("birthDate",),)), ("gender", "token", (("gender",),)),
                       ("death-date", "date", (("deceasedDateTime",),))),
    "Practitioner": _params(("identifier", "token", (("identifier",),)), ("name", "string", (("name",),))),
    "PractitionerRole": _params(("practitioner", "reference", (("practitioner",),)),
                                ("specialty", "token", (("specialty",),))),
    "Procedure": _params(*_PATIENT, _CODE, _STATUS, ("date", "date", (("performedDateTime",), ("performedPeriod",)))),
    "Provenance": _params(*_PATIENT, ("target", "reference", (("target",),))),
    "QuestionnaireResponse": _params(*_PATIENT, ("subject", "reference", ()), _STATUS,
                                     ("authored", "date", (("authored",),))),
    "RelatedPerson": _params(*_PATIENT, ("name", "string", (("name",),))),
    "ServiceRequest": _params(*_PATIENT, _CATEGORY, _CODE, _STATUS, ("authored", "date", (("authoredOn",),))),
    "Specimen": _params(*_PATIENT, ("type", "token", (("type",),))),
})
"""type -> {search parameter: (kind, paths)}; besides `_id` (every type). A `reference` with no
paths is one of the neutral query's fields (`patient`, `subject`: the patient; `practitioner`,
`actor`: an Appointment's participants); several ORed (`patient=A,B`) are a `Criterion` named
`patient`, `practitioner` or `actor`, which the matcher checks as it checks those fields."""
REFERENCE_TARGETS = MappingProxyType({"practitioner": "Practitioner", "encounter": "Encounter", "location": "Location"})
"""The one type a reference parameter of this name names: a bare id (`practitioner=x`) means `Type/x`."""
SUPPORTED_TYPES = tuple(sorted(SEARCH_PARAMS))
"""Every type served: US Core 6.1's, FamilyMemberHistory, and Appointment."""
PROFILES = MappingProxyType({
    **{kind: (f"us-core-{kind.lower()}",) for kind in SUPPORTED_TYPES if kind not in ("Appointment", "FamilyMemberHistory")},
    "Condition": ("us-core-condition-problems-health-concerns", "us-core-condition-encounter-diagnosis"),
    "DiagnosticReport": ("us-core-diagnosticreport-lab", "us-core-diagnosticreport-note"),
    "Observation": ("us-core-observation-lab", "us-core-vital-signs", "us-core-blood-pressure", "us-core-heart-rate",
                    "us-core-body-temperature", "us-core-body-weight", "us-core-smokingstatus"),
    "Device": ("us-core-implantable-device",),
})
"""type -> its US Core 6.1 profiles (ids under `US_CORE_PROFILE`); Appointment and FamilyMemberHistory have none."""
INCLUDES = MappingProxyType({"MedicationRequest": (("MedicationRequest:medication", "Medication", ("medicationReference",)),)})
"""type -> the `_include`s served: (value, the included type, the reference's path)."""
REVINCLUDES = (("Provenance:target", "Provenance", "target"),)
"""The `_revinclude`s served on every type: (value, the including type, its search parameter)."""
