"""One FHIR vocabulary: which patient a resource belongs to, the date of a resource, and whether a
resource matches a neutral `ResourceQuery`. Shared by the sandbox connector (its search), the
platform FHIR API (what it lets through) and the chart builder (what a chart holds), as Medplum
has one matcher for its repository. FHIR search *syntax* is not here (`connectors.fhir.query`).

References: `Patient/{id}` names the patient, versioned (`.../_history/2`) or not; an absolute
URL names them only when it is under the EHR's own FHIR base (`base`), never another server's.
Which elements link a resource to its patient is `connectors.compartment`'s (R4's Patient
CompartmentDefinition, as data).
Dates: a FHIR date or dateTime is a period (a day, a month, a year, or an instant); a resource
matches [start, end) when its period overlaps it, as FHIR's date search prefixes do.
"""
from __future__ import annotations

import datetime as dt
from types import MappingProxyType

import unicodedata

from connectors.base import Criterion, ResourceQuery
from connectors.compartment import in_compartment, reference_id  # noqa: F401
from connectors.us_core import SEARCH_PARAMS
from models.fhir_grammar import date_parts
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


# -- references and the patient compartment: `connectors.compartment`'s (R4's CompartmentDefinition) --

# `reference_id` and `in_compartment` are re-exported here: the matcher's callers ask one module.

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
    parts = date_parts(value)
    if parts is None:
        return None
    year, month, day, hour, minute, second, fraction, zone = parts
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
    an Encounter's `participant[].individual`)? Only a Reference object names one (a bare string,
    as an EHR may send, names nobody)."""
    return any(reference_id(value.get("reference"), "Practitioner", base) == practitioner_id
               for name in ("actor", "individual") for value in values_at(resource, ("participant", name))
               if isinstance(value, dict))


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
    if (query.start is not None or query.end is not None) and not in_range(resource, query.start, query.end):
        return False
    return not query.criteria or all(meets(resource, criterion, base) for criterion in query.criteria)


# -- criteria: a search parameter of `connectors.us_core.SEARCH_PARAMS` ---------------------------

def values_at(value, path: tuple[str, ...]) -> list:
    """The values at `path` in `value`, through lists at any step (a list at the end: its items)."""
    if isinstance(value, list):
        return [found for item in value for found in values_at(item, path)]
    if not path:
        return [] if value is None else [value]
    if not isinstance(value, dict):
        return []
    return values_at(value.get(path[0]), path[1:])


def _tokens(value) -> list[tuple[str | None, str]]:
    """(system, code) of a code, Coding, CodeableConcept, Identifier or boolean."""
    if isinstance(value, bool):
        return [(None, "true" if value else "false")]
    if isinstance(value, str):
        return [(None, value)]
    if not isinstance(value, dict):
        return []
    if isinstance(value.get("coding"), list):
        return [t for coding in value["coding"] for t in _tokens(coding)]
    code = value.get("code") if "code" in value else value.get("value")
    return [(value.get("system"), code)] if isinstance(code, str) else []


def _texts(value) -> list[str]:
    """The words a string search looks at: a string, or a HumanName's / Address's parts."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, dict):
        return []
    found = []
    for name in ("text", "family", "given", "prefix", "suffix", "line", "city", "district", "state", "postalCode",
                 "country"):
        item = value.get(name)
        found += [item] if isinstance(item, str) else [i for i in item or () if isinstance(i, str)] if isinstance(item, list) else []
    return found


def folded(text: str) -> str:
    """`text` as a string search compares it: case and accents ignored (R4 3.1.1.4.8)."""
    return "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c)).casefold()


def _span(value) -> tuple[dt.datetime, dt.datetime] | None:
    """[low, high) of a date, dateTime, instant or Period."""
    if isinstance(value, str):
        return period(value)
    if isinstance(value, dict) and ("start" in value or "end" in value):
        low, high = period(value.get("start")), period(value.get("end"))
        if low is None and high is None:
            return None
        return (low[0] if low else dt.datetime.min), (high[1] if high else dt.datetime.max)
    return None


def meets(resource: dict, criterion: Criterion, base: str | None = None) -> bool:
    """Does `resource` meet `criterion` (any of its values), as `SEARCH_PARAMS` defines the parameter?"""
    kind, paths = SEARCH_PARAMS.get(resource.get("resourceType"), {}).get(criterion.name, (None, ()))
    if kind != criterion.kind:
        return False
    if not paths:  # a participant of the neutral query's (`patient`, `practitioner`, `actor`): any of them
        return kind == "reference" and any(
            in_compartment(resource, ident, base) if of == "Patient" else of == "Practitioner" and takes_part(
                resource, ident, base) for of, ident in criterion.values)
    if kind == "date":
        (start, end), = criterion.values
        found = next((values_at(resource, path)[0] for path in paths if values_at(resource, path)), None)
        span = _span(found)
        return span is not None and (start is None or span[1] > start) and (end is None or span[0] < end)
    found = [value for path in paths for value in values_at(resource, path)]
    if kind == "token":
        have = [t for value in found for t in _tokens(value)]
        return any(code == want and (system is None or system == has_system)
                   for has_system, code in have for system, want in criterion.values)
    if kind == "string":
        words = [folded(text) for value in found for text in _texts(value)]
        return any(word.startswith(prefix) for word in words for prefix in criterion.values)
    if kind == "reference":
        references = [value.get("reference") for value in found if isinstance(value, dict)]
        return any(ident == wanted for reference in references for kind_, wanted in criterion.values
                   for ident in (_referenced(reference, kind_, base),))
    return False


def _referenced(reference, resource_type: str | None, base: str | None) -> str | None:
    """The id `reference` names (of `resource_type`, or of any type when None)."""
    if resource_type is not None:
        return reference_id(reference, resource_type, base)
    if not isinstance(reference, str) or "/" not in reference:
        return None
    kind = reference.split("/_history/")[0].rsplit("/", 2)[-2] if reference.count("/") >= 1 else ""
    return reference_id(reference, kind, base) if kind else None
