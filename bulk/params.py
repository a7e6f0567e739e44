"""A Bulk Data kick-off's parameters (FHIR Bulk Data Access 2.0 "Query Parameters"), parsed and checked.

From the query string of a `GET`, or the `Parameters` body of a `POST` (`application/fhir+json` or
`application/json`; each parameter a `valueString`, `_since` a `valueInstant` too, `patient` a
`valueReference`) with its URL's (`post_arguments`: a parameter in one of them only). A value of
the wrong shape is a 400 (`fhir_api.outcome.invalid`):

- `_type`: comma-separated types, repeatable; a type not exported at this level is a 400, or with
  `Prefer: handling=lenient` left out.
- `_since`: a FHIR instant (with seconds and a zone) whose UTC is within years 0001-9999, not in the future.
- `_outputFormat`: `application/fhir+ndjson`, `application/ndjson` or `ndjson` (in a URL's query,
  `application/fhir ndjson` too: its `+` sent unencoded).
- `_elements`: `element` or `Type.element`, comma-separated: each resource keeps them, `id` and
  `meta`, and is tagged SUBSETTED.
- `_typeFilter`: `Type?search`, the FHIR API's own search of the type (lenient: an unknown parameter
  is ignored; a bad value is a 400); several filters of one type are ORed.
- `includeAssociatedData`: accepted and ignored.
- `patient` (POST only): references `Patient/{id}`, limiting a Patient or Group export; on a
  system-level export a 400.
Anything else is ignored (lenient, as the FHIR API's search).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import re
from urllib.parse import parse_qs

from connectors.compartment import PATIENT_COMPARTMENT
from fhir_api.outcome import FhirError, invalid
from fhir_api.search import SUPPORTED_TYPES, parse_search, resource_id, search_arguments
from models.fhir_grammar import RESOURCE_TYPE

OUTPUT_FORMATS = ("application/fhir+ndjson", "application/ndjson", "ndjson")
UNENCODED_PLUS = "application/fhir ndjson"
"""`?_outputFormat=application/fhir+ndjson` typed without encoding `+` (%2B): a URL's query (a GET's,
or a POST's) takes it as the first of `OUTPUT_FORMATS` (`query_values`)."""
PATIENT_TYPES = ("Patient",) + tuple(t for t in SUPPORTED_TYPES if t in PATIENT_COMPARTMENT)
"""What a Patient or Group export writes: Patient, then the types of the Patient compartment."""
SYSTEM_TYPES = PATIENT_TYPES + tuple(t for t in SUPPORTED_TYPES if t not in PATIENT_TYPES)
"""What a system-level export writes: the patients' data, then the clinic's directory types."""
LEVELS = ("system", "patient", "group")
MAX_PATIENTS = 1000
MAX_TYPE_FILTERS = 50
MAX_ELEMENTS = 100
INSTANT = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})")
ELEMENT = re.compile(rf"(?:({RESOURCE_TYPE.pattern})\.)?([a-z][A-Za-z0-9]{{0,63}})")
PATIENT_IN_BODY = "The patient parameter is sent in a POST kick-off's Parameters body."
KNOWN = ("_type", "_since", "_outputFormat", "_elements", "_typeFilter", "includeAssociatedData", "patient")


@dataclasses.dataclass(frozen=True)
class ExportParameters:
    """A kick-off's parameters, checked: what the worker runs (`as_json` is what the job keeps)."""

    level: str
    types: tuple[str, ...]                  # the types asked (all of the level's when `_type` is absent)
    since: str | None = None                # ISO instant, UTC
    elements: tuple[tuple[str | None, str], ...] = ()   # (type or None: every type, element)
    type_filters: tuple[tuple[str, str], ...] = ()      # (type, its search query string)
    patients: tuple[str, ...] | None = None
    output_format: str = "application/fhir+ndjson"

    def as_json(self) -> dict:
        return {"level": self.level, "types": list(self.types), "since": self.since,
                "elements": [list(e) for e in self.elements], "type_filters": [list(f) for f in self.type_filters],
                "patients": None if self.patients is None else list(self.patients),
                "output_format": self.output_format}

    @classmethod
    def from_json(cls, value: dict) -> "ExportParameters":
        return cls(level=value["level"], types=tuple(value["types"]), since=value.get("since"),
                   elements=tuple(tuple(e) for e in value.get("elements") or ()),
                   type_filters=tuple(tuple(f) for f in value.get("type_filters") or ()),
                   patients=None if value.get("patients") is None else tuple(value["patients"]),
                   output_format=value.get("output_format") or OUTPUT_FORMATS[0])

    def since_datetime(self) -> dt.datetime | None:
        return None if self.since is None else _naive_utc(dt.datetime.fromisoformat(self.since.replace("Z", "+00:00")))


def level_types(level: str) -> tuple[str, ...]:
    return SYSTEM_TYPES if level == "system" else PATIENT_TYPES


def lenient_handling(prefer: str | None) -> bool:
    """Does `Prefer` ask for `handling=lenient`?"""
    return any(part.strip().lower().replace(" ", "") == "handling=lenient"
               for part in (prefer or "").replace(";", ",").split(","))


def respond_async(prefer: str | None) -> bool:
    """Does `Prefer` ask for `respond-async` (required by a kick-off)?"""
    return any(part.strip().lower() == "respond-async" for part in (prefer or "").replace(";", ",").split(","))


def _naive_utc(moment: dt.datetime) -> dt.datetime:
    return moment.astimezone(dt.timezone.utc).replace(tzinfo=None)


def query_values(raw: dict) -> dict[str, list[str]]:
    """A URL's query arguments (name -> [bytes]) as text (400 for non-UTF-8); an `_outputFormat` of
    `application/fhir ndjson` is `application/fhir+ndjson` whose `+` was not encoded."""
    found = {}
    for name, values in raw.items():
        try:
            found[name] = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values]
        except UnicodeDecodeError:
            raise invalid(f"The {name[:40]!r} parameter is not valid UTF-8.") from None
    if "_outputFormat" in found:
        found["_outputFormat"] = [OUTPUT_FORMATS[0] if v == UNENCODED_PLUS else v for v in found["_outputFormat"]]
    return found


def parameters_body(body) -> dict[str, list[str]]:
    """A POST's `Parameters` resource as (name -> [text]); 400 for anything else."""
    if not isinstance(body, dict) or body.get("resourceType") != "Parameters":
        raise invalid("A POST kick-off's body must be a FHIR Parameters resource.")
    found: dict[str, list[str]] = {}
    entries = body.get("parameter") or []
    if not isinstance(entries, list) or len(entries) > MAX_PATIENTS + 200:
        raise invalid("Parameters.parameter must be a list (of at most a few hundred entries).")
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise invalid("Each Parameters.parameter needs a name.")
        name = entry["name"]
        if name == "patient":
            ref = entry.get("valueReference")
            if not isinstance(ref, dict) or not isinstance(ref.get("reference"), str):
                raise invalid("A patient parameter is a valueReference {\"reference\": \"Patient/{id}\"}.")
            value = ref["reference"]
        else:
            values = [entry[k] for k in ("valueString", "valueInstant", "valueDateTime", "valueCode", "valueBoolean",
                                         "valueUri") if k in entry]
            if len(values) != 1 or not isinstance(values[0], (str, bool)):
                raise invalid(f"The {name[:40]!r} parameter needs one value (valueString, valueInstant...).")
            value = str(values[0]).lower() if isinstance(values[0], bool) else values[0]
        found.setdefault(name, []).append(value)
    return found


def post_arguments(query: dict[str, list[str]], body: dict[str, list[str]]) -> dict[str, list[str]]:
    """A POST kick-off's parameters: its URL's and its `Parameters` body's, each named in one of
    them only (400 naming one given in both: never the body's over the URL's, as a parameter
    repeated in one place is never last-wins); `patient` only in the body (the GET's 400)."""
    if "patient" in query:
        raise invalid(PATIENT_IN_BODY)
    both = [name for name in body if name in query]
    if both:
        raise invalid(f"{both[0][:40]!r} is given both in the URL and in the Parameters body: send it in one of them.")
    return {**query, **body}


def _split(values: list[str]) -> list[str]:
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def _since(values: list[str], now: dt.datetime) -> str | None:
    if not values:
        return None
    if len(values) > 1:
        raise invalid("_since may be given once.")
    value = values[0].strip()
    if not INSTANT.fullmatch(value):
        raise invalid("_since must be a FHIR instant with seconds and a zone, e.g. 2026-01-01T00:00:00Z.")
    try:
        moment = _naive_utc(dt.datetime.fromisoformat(value.replace("Z", "+00:00")))
    except (ValueError, OverflowError):  # OverflowError: its UTC is outside years 1-9999 (0001-01-01T00:00:00+01:00)
        raise invalid(f"_since: {value[:40]!r} is not a valid instant (or not within years 0001-9999 in UTC).") from None
    if moment > now:
        raise invalid("_since is in the future.")
    return moment.isoformat() + "Z"


def _types(values: list[str], level: str, lenient: bool) -> tuple[str, ...]:
    allowed = level_types(level)
    if not values:
        return allowed
    asked = list(dict.fromkeys(_split(values)))
    unknown = [t for t in asked if t not in allowed]
    if unknown and not lenient:
        raise invalid(f"_type names {', '.join(t[:64] for t in unknown[:5])}, not exported by a {level}-level "
                      f"export; exported: {', '.join(allowed)}.")
    kept = tuple(t for t in allowed if t in asked)
    if not kept:
        raise invalid("_type names no type exported here.")
    return kept


def _elements(values: list[str], types: tuple[str, ...]) -> tuple[tuple[str | None, str], ...]:
    found = []
    for item in _split(values):
        match = ELEMENT.fullmatch(item)
        if not match:
            raise invalid(f"_elements: {item[:64]!r} is not `element` or `Type.element`.")
        found.append((match.group(1), match.group(2)))
    if len(found) > MAX_ELEMENTS:
        raise invalid(f"_elements names at most {MAX_ELEMENTS} elements.")
    return tuple(dict.fromkeys(found))


def type_filter_args(query: str) -> dict[str, list[str]]:
    """A `_typeFilter`'s search part as search arguments (name -> [values]), checked as the FHIR API
    checks a query (`fhir_api.search.search_arguments`): 400 for a value not UTF-8 once decoded, holding
    a control character (NUL...), or overlong."""
    try:
        query.encode("utf-8")  # a lone surrogate (a POST's JSON escape) is no text either
        args = parse_qs(query, keep_blank_values=True, errors="strict")
    except (UnicodeEncodeError, UnicodeDecodeError):
        raise invalid("_typeFilter: its search holds a value that is not valid UTF-8.") from None
    try:
        return search_arguments(args)
    except FhirError as exc:
        raise invalid(f"_typeFilter: {exc.message}") from None


def _type_filters(values: list[str], types: tuple[str, ...], base_url: str) -> tuple[tuple[str, str], ...]:
    found = []
    for value in values:
        kind, mark, query = value.partition("?")
        if not mark or kind not in SUPPORTED_TYPES:
            raise invalid(f"_typeFilter: {value[:80]!r} is not `Type?search` of a type served here.")
        if kind not in types:
            continue  # a filter of a type not exported filters nothing
        args = type_filter_args(query)
        try:
            parse_search(kind, args, base_url)  # its 400, now
        except FhirError as exc:  # the filter's search, not the kick-off's parameters, refused it
            raise invalid(f"_typeFilter: {exc.message}") from None
        found.append((kind, query))
    if len(found) > MAX_TYPE_FILTERS:
        raise invalid(f"At most {MAX_TYPE_FILTERS} _typeFilter values.")
    return tuple(found)


def _patients(values: list[str], level: str, base_url: str) -> tuple[str, ...] | None:
    if not values:
        return None
    if level == "system":
        raise invalid("The patient parameter limits a Patient or Group export; a system-level export takes none.")
    if len(values) > MAX_PATIENTS:
        raise invalid(f"At most {MAX_PATIENTS} patient parameters.")
    found = []
    for value in values:
        if value.startswith(base_url + "/"):
            value = value[len(base_url) + 1:]
        kind, _, ident = value.rpartition("/")
        if kind != "Patient":
            raise invalid("A patient parameter references Patient/{id}.")
        found.append(resource_id(ident, "patient"))
    return tuple(dict.fromkeys(found))


def parse_kickoff(level: str, args: dict[str, list[str]], base_url: str, now: dt.datetime, lenient: bool,
                  from_post: bool) -> ExportParameters:
    """The checked parameters of a kick-off at `level` (`system`, `patient`, `group`)."""
    if "patient" in args and not from_post:
        raise invalid(PATIENT_IN_BODY)
    formats = args.get("_outputFormat") or [OUTPUT_FORMATS[0]]
    if len(formats) > 1 or formats[0] not in OUTPUT_FORMATS:
        raise invalid(f"_outputFormat must be one of {', '.join(OUTPUT_FORMATS)}.")
    types = _types(args.get("_type", []), level, lenient)
    return ExportParameters(
        level=level, types=types, since=_since(args.get("_since", []), now),
        elements=_elements(args.get("_elements", []), types),
        type_filters=_type_filters(args.get("_typeFilter", []), types, base_url),
        patients=_patients(args.get("patient", []), level, base_url), output_format=formats[0])
