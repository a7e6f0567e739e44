"""One FHIR vocabulary: which patient a resource belongs to, the date of a resource, and whether a
resource matches a neutral `ResourceQuery`. Shared by the sandbox connector (its search), the
platform FHIR API (what it lets through) and the chart builder (what a chart holds), as Medplum
has one matcher for its repository. FHIR search *syntax* is not here (`connectors.fhir.query`).

References: `Patient/{id}` names the patient, versioned (`.../_history/2`) or not; an absolute
URL names them only when it is under the EHR's own FHIR base (`base`), never another server's.
Dates: a FHIR date or dateTime is a period (a day, a month, a year, or an instant); a resource
matches [start, end) when its period overlaps it, as FHIR's date search prefixes do.
"""
from __future__ import annotations

import datetime as dt
import re
from types import MappingProxyType

from connectors.base import ResourceQuery
from models.npi import NPI_SYSTEM

DATE_ELEMENTS = MappingProxyType({
    "Appointment": (("start",),),
    "Encounter": (("period", "start"),),
    "Observation": (("effectiveDateTime",), ("effectiveInstant",), ("effectivePeriod", "start"), ("issued",)),
    "Condition": (("onsetDateTime",), ("onsetPeriod", "start"), ("recordedDate",)),
    "MedicationRequest": (("authoredOn",),),
    "AllergyIntolerance": (("recordedDate",), ("onsetDateTime",)),
    "DocumentReference": (("date",), ("content", "attachment", "creation"), ("context", "period", "start")),
})
"""The date of a resource, by type: the first of these elements present (a path into the resource;
through a list, its first item). Types not listed have no date: a date range matches none of them."""
PERIOD_END = MappingProxyType({"Encounter": ("period", "end"), "Observation": ("effectivePeriod", "end"),
                               "Condition": ("onsetPeriod", "end")})
"""Where a type's date is a period, its end (a missing end: the start's own precision)."""
PATIENT_REFERENCES = ("subject", "patient")
"""The elements naming a resource's patient (besides an Appointment's participants)."""
_DATE = re.compile(r"^(\d{4})(?:-(\d{2})(?:-(\d{2})(?:T(\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,9}))?)?"
                   r"(Z|[+-]\d{2}:\d{2})?)?)?)?$")


# -- references and the patient compartment ---------------------------------------------------

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


def patient_references(resource: dict) -> list:
    """Every reference that may name the resource's patient: `subject`, `patient`, and an
    Appointment's (or any resource's) `participant[].actor`."""
    found = [(resource.get(name) or {}).get("reference") for name in PATIENT_REFERENCES
             if isinstance(resource.get(name), dict)]
    found += [(p.get("actor") or {}).get("reference") for p in resource.get("participant") or ()
              if isinstance(p, dict) and isinstance(p.get("actor"), dict)]
    return found


def in_compartment(resource: dict, patient_id: str, base: str | None = None) -> bool:
    """Is `resource` the patient `patient_id`, or does it name them as its patient (`Patient/{id}`,
    versioned, or absolute under `base`)?"""
    if not isinstance(resource, dict) or not patient_id:
        return False
    if resource.get("resourceType") == "Patient":
        return resource.get("id") == patient_id
    return any(reference_id(r, "Patient", base) == patient_id for r in patient_references(resource))


# -- the date of a resource ---------------------------------------------------------------------

def _element(resource: dict, path: tuple[str, ...]):
    value = resource
    for name in path:
        if isinstance(value, list):
            value = value[0] if value else None
        if not isinstance(value, dict):
            return None
        value = value.get(name)
    return value if isinstance(value, str) and value else None


def date_of(resource: dict) -> str | None:
    """The date of a resource as FHIR writes it (a date or dateTime), or None (`DATE_ELEMENTS`)."""
    for path in DATE_ELEMENTS.get(resource.get("resourceType"), ()):
        value = _element(resource, path)
        if value:
            return value
    return None


def day_of(resource: dict) -> str:
    """The day of a resource as written, `YYYY-MM-DD` ("" when it has no full date): what a chart shows."""
    value = date_of(resource) or ""
    return value[:10] if len(value) >= 10 and period(value) else ""


def period(value: str | None) -> tuple[dt.datetime, dt.datetime] | None:
    """[low, high) in naive UTC of a FHIR date or dateTime (a dateTime without a zone is taken
    as UTC); None when it is not one."""
    match = _DATE.match(value or "")
    if not match:
        return None
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    try:
        if hour is not None:
            low = dt.datetime(int(year), int(month), int(day), int(hour), int(minute), int(second or 0),
                              int((fraction or "0")[:6].ljust(6, "0")))
            if zone and zone != "Z":
                sign = 1 if zone[0] == "+" else -1
                low -= sign * dt.timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6]))
            return low, low + dt.timedelta(microseconds=1)
        if day is not None:
            low = dt.datetime(int(year), int(month), int(day))
            return low, low + dt.timedelta(days=1)
        if month is not None:
            low = dt.datetime(int(year), int(month), 1)
            return low, dt.datetime(int(year) + int(month) // 12, int(month) % 12 + 1, 1)
        return dt.datetime(int(year), 1, 1), dt.datetime(int(year) + 1, 1, 1)
    except (ValueError, OverflowError):
        return None


def resource_period(resource: dict) -> tuple[dt.datetime, dt.datetime] | None:
    """The period the resource's date covers (with a period's end where the type has one)."""
    found = period(date_of(resource))
    end_path = PERIOD_END.get(resource.get("resourceType"))
    if found and end_path:
        end = period(_element(resource, end_path))
        if end and end[1] > found[0]:
            found = (found[0], end[1])
    return found


def in_range(resource: dict, start: dt.datetime | None, end: dt.datetime | None) -> bool:
    """Does the resource's date overlap [start, end)? (No range: yes; a range and no date: no.)"""
    if start is None and end is None:
        return True
    found = resource_period(resource)
    if found is None:
        return False
    low, high = found
    return (start is None or high > start) and (end is None or low < end)


# -- a neutral query ---------------------------------------------------------------------------

def has_npi(resource: dict, npi: str) -> bool:
    return any(isinstance(i, dict) and i.get("system") == NPI_SYSTEM and i.get("value") == npi
               for i in resource.get("identifier") or ())


def takes_part(resource: dict, practitioner_id: str, base: str | None = None) -> bool:
    """Does the practitioner take part in the resource (an Appointment's `participant[].actor`,
    an Encounter's `participant[].individual`)?"""
    for participant in resource.get("participant") or ():
        if isinstance(participant, dict):
            for name in ("actor", "individual"):
                if reference_id((participant.get(name) or {}).get("reference"), "Practitioner", base) == practitioner_id:
                    return True
    return False


def matches(resource: dict, query: ResourceQuery, base: str | None = None) -> bool:
    """Does `resource` match every field given in `query` (its offset and count aside)? The
    meaning of each field is `ResourceQuery`'s; a field that cannot apply to the type matches nothing."""
    if not isinstance(resource, dict) or resource.get("resourceType") != query.resource_type:
        return False
    kind = query.resource_type
    if query.ids and resource.get("id") not in query.ids:
        return False
    if query.patient is not None and not in_compartment(resource, query.patient, base):
        return False
    if query.practitioner is not None:
        if kind == "Practitioner":
            if resource.get("id") != query.practitioner:
                return False
        elif not takes_part(resource, query.practitioner, base):
            return False
    if query.npi is not None and (kind != "Practitioner" or not has_npi(resource, query.npi)):
        return False
    return in_range(resource, query.start, query.end)
