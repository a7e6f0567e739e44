"""FHIR search parameters -> the connector's neutral `ResourceQuery` (the API's only FHIR search
parser; connectors other than the FHIR one never see search syntax).

Strict: a parameter this API does not support for the type is a 400, as is a malformed value.
`date` (and Condition's `onset-date`) takes one or two values with a prefix `eq|ge|gt|le|lt`
(default `eq`) on a year, month, day or dateTime with a zone; the values intersect. References
are `id`, `Type/id` or `{iss}/Type/id`. `_count` (default 50) is capped at 100; `_offset` pages.
`code` and `category` (token search on codings) are `fhir_api.codes`'s.
"""
from __future__ import annotations

import datetime as dt
import re
from types import MappingProxyType

from connectors import ResourceQuery
from fhir_api.outcome import invalid
from models.ids import ID_RULE, fhir_id, is_id
from models.npi import NPI_SYSTEM

SUPPORTED_TYPES = ("Patient", "Practitioner", "Appointment", "Encounter", "Condition", "Observation",
                   "MedicationRequest", "AllergyIntolerance")
SEARCH_PARAMS = MappingProxyType({
    "Patient": ("_id",),
    "Practitioner": ("_id", "identifier"),
    "Appointment": ("_id", "patient", "practitioner", "actor", "date"),
    "Encounter": ("_id", "patient", "subject", "date"),
    "Condition": ("_id", "patient", "subject", "onset-date", "code", "category"),
    "Observation": ("_id", "patient", "subject", "date", "code", "category"),
    "MedicationRequest": ("_id", "patient", "subject"),
    "AllergyIntolerance": ("_id", "patient"),
})
CONTROL_PARAMS = ("_count", "_offset", "_format")
DEFAULT_COUNT = 50
MAX_COUNT = 100
MAX_OFFSET = 100_000
MAX_IDS = 100
MAX_VALUE_LENGTH = 512
_DATE = re.compile(r"^(eq|ge|gt|le|lt)?(\d{4})(?:-(\d{2})(?:-(\d{2})(?:T(\d{2}):(\d{2})(?::(\d{2})(?:\.\d{1,9})?)?"
                   r"(Z|[+-]\d{2}:\d{2}))?)?)?$")


class Unmatchable(Exception):
    """The search can match nothing (e.g. an identifier of another system): an empty Bundle."""


def resource_id(value: str, what: str = "id") -> str:
    """A resource id of the shape ids have, in R4's spelling (`models.ids.fhir_id`: the spelling
    before issue 35, `pat_…`, names the same resource as `pat-…`), else 400. Every id a FHIR
    request names (the path's, `_id`, a reference) passes here."""
    if not is_id(value):
        raise invalid(f"{what} must be {ID_RULE}.")
    return fhir_id(value)


def reference(value: str, types: tuple[str, ...], base_url: str, name: str) -> tuple[str, str | None]:
    """(type, id) of a reference `id`, `Type/id` or `{base}/Type/id`; the type is None for a bare id."""
    if value.startswith(base_url + "/"):
        value = value[len(base_url) + 1:]
    kind, _, ident = value.rpartition("/")
    if kind and kind not in types:
        raise invalid(f"{name} must reference {' or '.join(types)}.")
    return (kind or None), resource_id(ident, name)


def _bounds(value: str, name: str) -> tuple[dt.datetime | None, dt.datetime | None]:
    match = _DATE.match(value)
    if not match:
        raise invalid(f"{name} must be [eq|ge|gt|le|lt]YYYY[-MM[-DD[Thh:mm[:ss]+zone]]], e.g. ge2026-01-01.")
    prefix, year, month, day, hour, minute, second, zone = match.groups()
    if hour is not None and zone is None:
        raise invalid(f"{name}: a time needs a zone (Z or +hh:mm).")
    try:
        if hour is not None:
            low = dt.datetime.fromisoformat(f"{year}-{month}-{day}T{hour}:{minute}:{second or '00'}"
                                            f"{'+00:00' if zone == 'Z' else zone}")
            low = low.astimezone(dt.timezone.utc).replace(tzinfo=None)
            high = low + dt.timedelta(seconds=1 if second else 60)
        elif day is not None:
            low = dt.datetime(int(year), int(month), int(day))
            high = low + dt.timedelta(days=1)
        elif month is not None:
            low = dt.datetime(int(year), int(month), 1)
            high = dt.datetime(int(year) + int(month) // 12, int(month) % 12 + 1, 1)
        else:
            low, high = dt.datetime(int(year), 1, 1), dt.datetime(int(year) + 1, 1, 1)
    except (ValueError, OverflowError):
        raise invalid(f"{name}: {value!r} is not a valid date.") from None
    prefix = prefix or "eq"
    return {"eq": (low, high), "ge": (low, None), "gt": (high, None), "le": (None, high), "lt": (None, low)}[prefix]


def date_range(values: list[str], name: str) -> tuple[dt.datetime | None, dt.datetime | None]:
    """[start, end) of one or two date parameters (intersected)."""
    if len(values) > 2:
        raise invalid(f"{name} may be given at most twice (a lower and an upper bound).")
    start = end = None
    for value in values:
        low, high = _bounds(value, name)
        start = low if start is None or (low is not None and low > start) else start
        end = high if end is None or (high is not None and high < end) else end
    return start, end


def _integer(value: str, name: str, low: int, high: int) -> int:
    if not re.fullmatch(r"\d{1,7}", value):
        raise invalid(f"{name} must be a whole number.")
    number = int(value)
    if number < low:
        raise invalid(f"{name} must be at least {low}.")
    return min(number, high)


def search_arguments(raw: dict) -> dict[str, list[str]]:
    """The request's query arguments (name -> [bytes]) as text; 400 for non-UTF-8, control
    characters or overlong values. `_format` is content negotiation's (`fhir_api.formats`)."""
    found = {}
    for name, values in raw.items():
        texts = []
        for value in values:
            try:
                text = value.decode("utf-8") if isinstance(value, bytes) else str(value)
            except UnicodeDecodeError:
                raise invalid(f"The {name[:40]!r} parameter is not valid UTF-8.") from None
            if len(text) > MAX_VALUE_LENGTH or any(ord(c) < 32 or ord(c) == 127 for c in text):
                raise invalid(f"The {name[:40]!r} parameter is too long or holds control characters.")
            texts.append(text)
        found[name] = texts
    return found


def parse_search(resource_type: str, args: dict[str, list[str]], base_url: str) -> ResourceQuery:
    """The `ResourceQuery` for a search of `resource_type`; raises `Unmatchable` for a search
    that cannot match anything."""
    allowed = SEARCH_PARAMS[resource_type]
    for name, values in args.items():
        if name not in allowed and name not in CONTROL_PARAMS:
            supported = ", ".join(allowed + CONTROL_PARAMS[:2])
            raise invalid(f"Unknown search parameter {name[:60]!r} for {resource_type}; supported: {supported}.")
        if len(values) > 1 and name not in ("date", "onset-date"):
            raise invalid(f"The {name} parameter is repeated.")
    one = {name: values[0] for name, values in args.items()}
    fields: dict = {"resource_type": resource_type}
    if "_id" in one:
        ids = tuple(dict.fromkeys(resource_id(v, "_id") for v in one["_id"].split(",")))
        if len(ids) > MAX_IDS:
            raise invalid(f"_id names at most {MAX_IDS} ids.")
        fields["ids"] = ids
    patients = set()
    for name in ("patient", "subject"):
        if name in one:
            patients.add(reference(one[name], ("Patient",), base_url, name)[1])
    if "practitioner" in one:
        fields["practitioner"] = reference(one["practitioner"], ("Practitioner",), base_url, "practitioner")[1]
    if "actor" in one:
        kind, ident = reference(one["actor"], ("Patient", "Practitioner"), base_url, "actor")
        if kind is None:
            raise invalid("actor must name its type: Patient/{id} or Practitioner/{id}.")
        if kind == "Patient":
            patients.add(ident)
        elif fields.setdefault("practitioner", ident) != ident:
            raise Unmatchable()
    if len(patients) > 1:
        raise Unmatchable()
    if patients:
        fields["patient"] = patients.pop()
    if "identifier" in one:
        system, bar, value = one["identifier"].rpartition("|")
        if not value:
            raise invalid("identifier must be [system|]value.")
        if bar and system and system != NPI_SYSTEM:
            raise Unmatchable()
        fields["npi"] = value
    for name in ("date", "onset-date"):
        if name in args:
            fields["start"], fields["end"] = date_range(args[name], name)
            if fields["start"] and fields["end"] and fields["start"] >= fields["end"]:
                raise Unmatchable()
    fields["count"] = _integer(one["_count"], "_count", 1, MAX_COUNT) if "_count" in one else DEFAULT_COUNT
    fields["offset"] = _integer(one["_offset"], "_offset", 0, MAX_OFFSET) if "_offset" in one else 0
    if fields["offset"] >= MAX_OFFSET:
        raise invalid(f"_offset must be below {MAX_OFFSET}.")
    return ResourceQuery(**fields)
