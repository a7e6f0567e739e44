"""The patient compartment, as data: FHIR R4's Patient CompartmentDefinition for the types served.

`PATIENT_COMPARTMENT` says, per type, which search parameters link a resource to a patient and the
element each one reads (the R4 search parameter's expression). A resource is in patient X's
compartment when it is X, or one of those elements references `Patient/X` (versioned or not; an
absolute URL only under the EHR's own base). Every rule that asks "whose data is this?" asks this
module: the FHIR API's access rule (`fhir_api.access`), the neutral matcher (`connectors.matching`,
so the sandbox's search and charts), the FHIR connector's searches and its `ehr.fetch` records,
and the disclosure audit of the FHIR API (`fhir_api.disclosure`).

Two choices on top of R4 (docs/fhir-api.md):
- Device: R4 leaves it out of the Patient compartment; US Core serves a patient's (implantable)
  devices by `Device.patient`, so it is in here by `patient`: a `patient/` scope never reads
  another patient's device.
- Patient: a Patient is in its own compartment only (R4's `link` would let a `patient/` token read
  the records of the patients it links to).
"""
from __future__ import annotations

from types import MappingProxyType

PATIENT_COMPARTMENT = MappingProxyType({
    "AllergyIntolerance": (("patient", ("patient",)), ("recorder", ("recorder",)), ("asserter", ("asserter",))),
    "Appointment": (("actor", ("participant", "actor")),),
    "CarePlan": (("patient", ("subject",)), ("performer", ("activity", "detail", "performer"))),
    "CareTeam": (("patient", ("subject",)), ("participant", ("participant", "member"))),
    "Condition": (("patient", ("subject",)), ("asserter", ("asserter",))),
    "Coverage": (("policy-holder", ("policyHolder",)), ("subscriber", ("subscriber",)),
                 ("beneficiary", ("beneficiary",)), ("payor", ("payor",))),
    "Device": (("patient", ("patient",)),),
    "DiagnosticReport": (("subject", ("subject",)),),
    "DocumentReference": (("subject", ("subject",)), ("author", ("author",))),
    "Encounter": (("subject", ("subject",)),),
    "FamilyMemberHistory": (("patient", ("patient",)),),
    "Goal": (("patient", ("subject",)),),
    "Immunization": (("patient", ("patient",)),),
    "MedicationDispense": (("subject", ("subject",)), ("patient", ("subject",)), ("receiver", ("receiver",))),
    "MedicationRequest": (("subject", ("subject",)),),
    "Observation": (("subject", ("subject",)), ("performer", ("performer",))),
    "Procedure": (("patient", ("subject",)), ("performer", ("performer", "actor"))),
    "Provenance": (("patient", ("target",)),),
    "QuestionnaireResponse": (("subject", ("subject",)), ("author", ("author",))),
    "RelatedPerson": (("patient", ("patient",)),),
    "ServiceRequest": (("subject", ("subject",)), ("performer", ("performer",))),
    "Specimen": (("subject", ("subject",)),),
})
"""type -> ((search parameter, element path), ...): what links a resource of the type to a patient."""
COMPARTMENT_PATHS = MappingProxyType({kind: tuple(dict.fromkeys(path for _, path in links))
                                      for kind, links in PATIENT_COMPARTMENT.items()})
"""type -> the distinct element paths of its links (precomputed: the matcher's hot path)."""
SEARCH_BY_PATIENT = ("patient", "subject")
"""R4's parameters that search a type by its patient (`Observation?patient=X`), besides its compartment's."""
SUBJECT_PATHS = MappingProxyType({kind: tuple(dict.fromkeys(path for name, path in links if name in SEARCH_BY_PATIENT))
                                  for kind, links in PATIENT_COMPARTMENT.items()})
"""type -> the element paths of its `patient`/`subject` links: the patient a resource is *about*
(Condition `subject`, AllergyIntolerance `patient`), not who asserted, recorded, performed or wrote it."""
PATIENT_PARAMS = MappingProxyType({
    kind: tuple(dict.fromkeys(SEARCH_BY_PATIENT + tuple(name for name, _ in links))) for kind, links in PATIENT_COMPARTMENT.items()}
    | {"Patient": ("_id",)})
"""type -> the search parameters whose values name a patient (what a failed search asked for)."""


def in_patient_compartment(resource_type: str) -> bool:
    """Can a resource of `resource_type` belong to a patient (Patient itself included)?"""
    return resource_type == "Patient" or resource_type in PATIENT_COMPARTMENT


def reference_id(reference, resource_type: str, base: str | None = None) -> str | None:
    """The id that `reference` names of `resource_type`: `Type/id`, versioned or not, or
    `{base}/Type/id` under the EHR's own base; None for anything else (another type, another
    server's URL, a contained `#id`, a `urn:`)."""
    if not isinstance(reference, str):
        return None
    reference = reference.split("/_history/")[0]
    if base and reference.startswith(base.rstrip("/") + "/"):
        reference = reference[len(base.rstrip("/")) + 1:]
    kind, slash, ident = reference.partition("/")
    if kind != resource_type or not slash or not ident or "/" in ident:
        return None
    return ident


def _references(value, path: tuple[str, ...]) -> list:
    """The `reference` strings at `path` in `value` (through lists at any step); one step (the
    usual `subject`, `patient`) without recursion: the matcher's hot path."""
    if len(path) == 1 and isinstance(value, dict):
        found = value.get(path[0])
        if isinstance(found, dict):
            return [found["reference"]] if isinstance(found.get("reference"), str) else []
        if not isinstance(found, list):
            return []
        return [r["reference"] for r in found if isinstance(r, dict) and isinstance(r.get("reference"), str)]
    if isinstance(value, list):
        return [reference for item in value for reference in _references(item, path)]
    if not isinstance(value, dict):
        return []
    if not path:
        return [value["reference"]] if isinstance(value.get("reference"), str) else []
    return _references(value.get(path[0]), path[1:])


def patients_of(resource: dict, base: str | None = None) -> list[str]:
    """The patients in whose compartment `resource` is (a Patient: itself), in order, once each."""
    if not isinstance(resource, dict):
        return []
    kind = resource.get("resourceType")
    if kind == "Patient":
        return [resource["id"]] if isinstance(resource.get("id"), str) else []
    found = []
    for path in COMPARTMENT_PATHS.get(kind, ()):
        for reference in _references(resource, path):
            ident = reference_id(reference, "Patient", base)
            if ident is not None and ident not in found:
                found.append(ident)
    return found


def in_compartment(resource: dict, patient_id: str, base: str | None = None) -> bool:
    """Is `resource` the patient `patient_id`, or in their compartment?"""
    return _names_patient(resource, patient_id, base, COMPARTMENT_PATHS)


def about_patient(resource: dict, patient_id: str, base: str | None = None) -> bool:
    """Is `resource` the patient `patient_id`, or about them (its `patient`/`subject` names them)?
    Narrower than `in_compartment`: a Condition that the patient asserted about their child is in
    the patient's compartment, and is the child's. What a chart of the patient holds."""
    return _names_patient(resource, patient_id, base, SUBJECT_PATHS)


def _names_patient(resource: dict, patient_id: str, base: str | None, paths) -> bool:
    if not isinstance(resource, dict) or not patient_id:
        return False
    kind = resource.get("resourceType")
    if kind == "Patient":
        return resource.get("id") == patient_id
    # `Patient/{id}` itself (nearly every reference) is compared as it is: `reference_id` would
    # give `patient_id` for it too (an id without a `/` has no `/_history/` either).
    direct = f"Patient/{patient_id}" if "/" not in patient_id else None
    for path in paths.get(kind, ()):
        for reference in _references(resource, path):
            if reference == direct or reference_id(reference, "Patient", base) == patient_id:
                return True
    return False


def asked_patients(resource_type: str, args: dict, base: str | None = None) -> list[str]:
    """The patients a search of `resource_type` asks for, from its parameters (name -> [values]):
    the values of its `PATIENT_PARAMS` (`X`, `Patient/X`, `{base}/Patient/X`, a comma for OR; a
    modifier such as `patient:Patient` counts), and a Patient search's `_id`."""
    names = PATIENT_PARAMS.get(resource_type, ())
    found = []
    for raw_name, values in args.items():
        name = str(raw_name).split(":")[0]
        if name not in names:
            continue
        for value in values if isinstance(values, (list, tuple)) else (values,):
            for item in str(value).split(","):
                item = item.strip()
                ident = item if "/" not in item else reference_id(item, "Patient", base)
                if ident is None and "/Patient/" in item:  # an absolute URL of this base's shape
                    ident = item.rpartition("/Patient/")[2].split("/_history/")[0]
                if ident and ident not in found:
                    found.append(ident)
    return found
