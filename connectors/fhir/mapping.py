"""FHIR resources as the connector interface's records (appointments, patients), and the EHR's
absolute references made relative to the platform."""
from __future__ import annotations

import datetime as dt
import logging

from connectors.base import LISTED_STATUSES, Appointment, Patient
from connectors.fhir.spool import text_of
from connectors.fhir.transport import relative_to_base
from models.fhir_grammar import fhir_day
from models.ids import is_id

MAX_REFERENCE_DEPTH = 64         # how deep into a resource references are made relative (deeper: left out)
REFERENCE_KEYS = ("reference", "fullUrl", "url")
EXTENSION_KEYS = ("extension", "modifierExtension")
FOREIGN_DISPLAY = "A reference outside the clinic's EHR (removed)"

log = logging.getLogger("svc_auth.connectors.fhir")


def relative_references(value, base: str, depth: int = 0, key: str | None = None):
    """`value` with references pointing only at the platform (docs/fhir-api.md, "References"):

    - a `reference`, `fullUrl` or `url` that is an absolute URL inside this EHR's `base` is made
      relative (`{base}/Patient/x` -> `Patient/x`): the platform API serves its own base;
    - any other absolute one (another host, or this host outside the base) is removed: a Reference
      keeps its `display` (or gets `FOREIGN_DISPLAY`), a `fullUrl` or an attachment's `url` is dropped;
    - relative references, `#contained` ones and `urn:` ids are kept; an extension's `url` (what
      the extension is, not where to go) is kept.
    Deeper than `MAX_REFERENCE_DEPTH`, an element is left out."""
    if depth > MAX_REFERENCE_DEPTH:
        return None
    if isinstance(value, list):
        return [relative_references(item, base, depth + 1, key) for item in value]
    if not isinstance(value, dict):
        return value
    found = {name: relative_references(item, base, depth + 1, name) for name, item in value.items()}
    for name in REFERENCE_KEYS:
        if name == "url" and key in EXTENSION_KEYS:
            continue
        target = found.get(name)
        if not isinstance(target, str) or not _absolute(target):
            continue
        relative = relative_to_base(target, base)
        if relative is not None:
            found[name] = relative
            continue
        del found[name]
        if name == "reference" and not found.get("display"):
            found["display"] = FOREIGN_DISPLAY
    return found


def _absolute(reference: str) -> bool:
    """Whether a reference names a server (`scheme://...`, `//host/...`, `scheme:` other than `urn:`)."""
    head = reference.split("/", 1)[0]
    return reference.startswith("//") or (":" in head and not reference.lower().startswith("urn:"))


class Unlisted(ValueError):
    """Why an appointment the EHR sent cannot be listed (its message is the night report's reason)."""


def participants(resource: dict) -> list[dict]:
    """The appointment's participants; `Unlisted` when one is not an object (a bare string...)."""
    found = resource.get("participant") or []
    if not isinstance(found, list) or not all(isinstance(p, dict) and isinstance(p.get("actor") or {}, dict)
                                              for p in found):
        raise Unlisted("malformed participant")
    return found


def patient_reference(resource: dict) -> str | None:
    """`Patient/{id}` of the appointment's patient participant (None when none or malformed)."""
    try:
        found = participants(resource)
    except Unlisted:
        return None
    return next((p["actor"]["reference"] for p in found if isinstance((p.get("actor") or {}).get("reference"), str)
                 and p["actor"]["reference"].startswith("Patient/")), None)


def of_practitioner(resource: dict, practitioner_id: str, base: str) -> bool:
    """Whether a participant's actor references `Practitioner/{practitioner_id}` (relative, absolute
    inside the EHR's `base`, or versioned): that is when an appointment is the physician's
    (CONTRACTS.md, "Mapping"), whatever the EHR's search did with `practitioner` (a server may
    ignore a search parameter it does not support, and answer the whole clinic's schedule). A
    participant or actor written as a bare string counts, so that `appointment_of` names it
    (`malformed participant`)."""
    found = resource.get("participant")
    for participant in found if isinstance(found, list) else ():
        actor = participant.get("actor") if isinstance(participant, dict) else participant
        reference = actor.get("reference") if isinstance(actor, dict) else actor  # a bare string: malformed, named
        if isinstance(reference, str) and _absolute(reference):
            reference = relative_to_base(reference, base)
        if not isinstance(reference, str):
            continue
        parts = reference.split("/")
        if parts[:2] == ["Practitioner", practitioner_id] and (len(parts) == 2 or parts[2] == "_history"):
            return True
    return False


def starts_within(resource: dict, start: dt.datetime, end: dt.datetime) -> bool:
    """Whether the appointment starts in [start, end) (naive UTC), whatever the EHR's date search
    did; True when its start cannot be read (`appointment_of` then says why it is not listed)."""
    try:
        begins = _datetime(resource.get("start"))
    except Unlisted:
        return True
    return start <= begins < end


def appointment_of(resource: dict, patients: dict) -> Appointment | None:
    """Our Appointment for a FHIR Appointment: None when its status is not listed; `Unlisted`
    naming why when it should be listed and cannot be (no patient, an unparseable instant, an
    impossible birthDate, a malformed participant...)."""
    if resource.get("status") not in LISTED_STATUSES:
        return None
    if not isinstance(resource.get("id"), str) or not resource["id"]:
        raise Unlisted("no id")
    if not is_id(resource["id"]):  # a row's id column holds 64 characters, and no text a NUL
        raise Unlisted("invalid id")
    if not resource.get("start"):
        raise Unlisted("no start")
    start = _datetime(resource["start"], "start")
    end = _datetime(resource.get("end") or resource["start"], "end")
    found = participants(resource)
    reference = patient_reference(resource)
    if reference is None:
        raise Unlisted("no patient participant")
    patient = patients.get(reference)
    if patient is None:
        raise Unlisted("patient not found in the EHR")
    location = next(((p.get("actor") or {}).get("display", "") for p in found
                     if str((p.get("actor") or {}).get("reference", "")).startswith("Location/")), "")
    return Appointment(id=resource["id"], start=start, end=end,
                       status=resource["status"], appointment_type=text_of(_object(resource.get("appointmentType"))),
                       reason=text_of(_object(next(iter(resource.get("reasonCode") if isinstance(resource.get("reasonCode"), list)
                                                        else ()), None)))
                       or _string(resource.get("description")),
                       location=_string(location), patient=listed_patient(patient))


def listed_patient(resource: dict) -> Patient:
    """`patient_of` for a schedule, whose rows need a day of birth: `Unlisted` when the birthDate is
    missing or not a whole day (FHIR allows "1980" and "1980-05")."""
    if not is_id(resource.get("id")):
        raise Unlisted("patient without a valid id")
    if not resource.get("birthDate"):
        raise Unlisted("patient has no birthDate")
    patient = patient_of(resource)
    if patient.date_of_birth is None:
        raise Unlisted("patient's birthDate is not a whole day")
    return patient


def patient_of(resource: dict) -> Patient:
    """Our Patient for a FHIR Patient; `Unlisted` when its birthDate is not a real date."""
    names = resource.get("name") if isinstance(resource.get("name"), list) else []
    name = next((n for n in names if isinstance(n, dict)), {})
    given = name.get("given") if isinstance(name.get("given"), list) else []
    birth = resource.get("birthDate")
    birth = birth if isinstance(birth, str) else ""
    born = fhir_day(birth)
    if born is None and len(birth) == 10:  # shaped as a day, and not one FHIR writes
        raise Unlisted("impossible birthDate")
    return Patient(id=resource["id"], first_name=" ".join(g for g in given if isinstance(g, str)),
                   last_name=_string(name.get("family")), date_of_birth=born, sex=_string(resource.get("gender")) or "unknown")


def _object(value) -> dict | None:
    return value if isinstance(value, dict) else None


def _string(value) -> str:
    return value if isinstance(value, str) else ""


def _datetime(text, field: str = "start") -> dt.datetime:
    """A FHIR instant as naive UTC; `Unlisted` when it is not one."""
    try:
        value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (AttributeError, TypeError, ValueError):
        raise Unlisted(f"unparseable {field}") from None
    return value.astimezone(dt.timezone.utc).replace(tzinfo=None) if value.tzinfo else value
