"""FHIR resources as the connector interface's records (appointments, patients), and the EHR's
absolute references made relative to the platform."""
from __future__ import annotations

import datetime as dt
import logging

from connectors.base import Appointment, Patient
from connectors.fhir.spool import text_of
from connectors.fhir.transport import relative_to_base

MAX_REFERENCE_DEPTH = 64         # how deep into a resource references are made relative (deeper: left out)
REFERENCE_KEYS = ("reference", "fullUrl", "url")
EXTENSION_KEYS = ("extension", "modifierExtension")
FOREIGN_DISPLAY = "A reference outside the clinic's EHR (removed)"
LISTED_STATUSES = ("proposed", "pending", "booked", "arrived", "checked-in")
"""FHIR Appointment statuses that are listed (the FHIR code is the API's `status`); `cancelled`,
`noshow`, `entered-in-error`, `fulfilled` and `waitlist` are not."""

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


def appointment_of(resource: dict, patients: dict) -> Appointment | None:
    """Our Appointment for a FHIR Appointment (None when it is not listed or names no patient)."""
    if resource.get("status") not in LISTED_STATUSES or not resource.get("start"):
        return None
    reference = next((p["actor"]["reference"] for p in resource.get("participant") or ()
                      if str((p.get("actor") or {}).get("reference", "")).startswith("Patient/")), None)
    patient = patients.get(reference)
    if patient is None:
        return None
    if not patient.get("birthDate"):
        log.warning("Patient %s has no birthDate: appointment %s is not listed", patient.get("id"), resource.get("id"))
        return None
    location = next(((p.get("actor") or {}).get("display", "") for p in resource.get("participant") or ()
                     if str((p.get("actor") or {}).get("reference", "")).startswith("Location/")), "")
    start = _datetime(resource["start"])
    return Appointment(id=resource["id"], start=start, end=_datetime(resource.get("end") or resource["start"]),
                       status=resource["status"], appointment_type=text_of(resource.get("appointmentType")),
                       reason=text_of((resource.get("reasonCode") or [None])[0]) or resource.get("description", ""),
                       location=location or "", patient=patient_of(patient))


def patient_of(resource: dict) -> Patient:
    name = next(iter(resource.get("name") or ()), {})
    birth = resource.get("birthDate") or ""
    return Patient(id=resource["id"], first_name=" ".join(name.get("given") or ()), last_name=name.get("family", ""),
                   date_of_birth=dt.date.fromisoformat(birth) if len(birth) == 10 else None,
                   sex=resource.get("gender", "unknown"))


def _datetime(text: str) -> dt.datetime:
    """A FHIR instant as naive UTC."""
    value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value.astimezone(dt.timezone.utc).replace(tzinfo=None) if value.tzinfo else value
