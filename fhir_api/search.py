"""FHIR search parameters -> the connector's neutral `ResourceQuery` (the API's only FHIR search
parser; connectors other than the FHIR one never see search syntax).

The parameters of each type are `connectors.us_core.SEARCH_PARAMS`'s (US Core 6.1), besides `_id`.
Lenient by default (FHIR R4 "Handling Errors"): a parameter not served for the type is ignored
and left out of the `self` link; `strict` (`Prefer: handling=strict`) makes it a 400 naming it. A
malformed value of a served parameter is a 400 either way. A `date` parameter takes one or two
values with a prefix `eq|ge|gt|le|lt` (default `eq`) on a year, month, day or dateTime with a
zone; the values intersect. A token is `[system|]code`, a string matches a prefix (case and
accents ignored), a reference is `id`, `Type/id` or `{iss}/Type/id`; a comma ORs values. `_count`
(default 50) is capped at 100; `_offset` pages (on a FHIR clinic the `next` link's signed `_cursor`
does: `fhir_api.cursor`).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import re
from dataclasses import dataclass

from connectors import Criterion, ResourceQuery
from connectors.matching import folded
from connectors.us_core import INCLUDES, REFERENCE_TARGETS, REVINCLUDES, SEARCH_PARAMS, SUPPORTED_TYPES  # noqa: F401
from fhir_api.cursor import CURSOR_PARAM, MAX_CURSOR_CHARS
from fhir_api.outcome import invalid
from models.fhir_grammar import date_parts
from models.ids import ID_RULE, fhir_id, is_id

CONTROL_PARAMS = ("_count", "_offset", "_format", "_include", "_revinclude", "_cursor")
REFERENCE_TYPES = SUPPORTED_TYPES
MAX_OR_VALUES = 20
DEFAULT_COUNT = 50
MAX_COUNT = 100
MAX_OFFSET = 100_000
MAX_IDS = 100
MAX_VALUE_LENGTH = 512
DATE_PREFIXES = ("eq", "ge", "gt", "le", "lt")
"""A date search value's comparator prefix (the date after it: `models.fhir_grammar.DATE`)."""


class Unmatchable(Exception):
    """The search can match nothing (e.g. an identifier of another system): an empty Bundle."""


def resource_id(value: str, what: str = "id") -> str:
    """A resource id of the shape ids have, in R4's spelling (`models.ids.fhir_id`: the spelling
    before issue 35, `pat_…`, names the same resource as `pat-…`), else 400. Every id a FHIR
    request names (the path's, `_id`, a reference) passes here."""
    if not is_id(value):
        raise invalid(f"{what} must be {ID_RULE}.")
    return fhir_id(value)


def reference(value: str, types: tuple[str, ...], base_url: str, name: str,
              any_type: bool = False) -> tuple[str, str | None]:
    """(type, id) of a reference `id`, `Type/id` or `{base}/Type/id`; the type is None for a bare id.
    `any_type`: any type served, else one of `types`."""
    if value.startswith(base_url + "/"):
        value = value[len(base_url) + 1:]
    kind, _, ident = value.rpartition("/")
    if kind and kind not in (REFERENCE_TYPES if any_type else types):
        raise invalid(f"{name} must reference {' or '.join(types)}.")
    return (kind or None), resource_id(ident, name)


def _bounds(value: str, name: str) -> tuple[dt.datetime | None, dt.datetime | None]:
    prefix = value[:2] if value[:2] in DATE_PREFIXES else None
    parts = date_parts(value[2:] if prefix else value)
    if parts is None:
        raise invalid(f"{name} must be [eq|ge|gt|le|lt]YYYY[-MM[-DD[Thh:mm[:ss]+zone]]], e.g. ge2026-01-01.")
    year, month, day, hour, minute, second, _, zone = parts
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
    if not re.fullmatch(r"[0-9]{1,7}", value):
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
            if len(text) > (MAX_CURSOR_CHARS if name == CURSOR_PARAM else MAX_VALUE_LENGTH) or any(ord(c) < 32 or ord(c) == 127 for c in text):
                raise invalid(f"The {name[:40]!r} parameter is too long or holds control characters.")
            texts.append(text)
        found[name] = texts
    return found


def strict_handling(prefer: str | None) -> bool:
    """Does the `Prefer` header ask for `handling=strict` (FHIR R4 3.1.1.2)? Lenient otherwise. The
    value may be quoted (RFC 7240: a `word`, token or quoted-string), the name and value in any case."""
    return any(part.strip().lower().replace(" ", "") in ("handling=strict", 'handling="strict"')
               for part in (prefer or "").replace(";", ",").split(","))


@dataclass(frozen=True)
class Search:
    """A parsed search: the neutral `query`, the parameters `applied` (the Bundle's `self` link:
    those ignored are left out), the `ignored` ones' names, and the `_include`s / `_revinclude`s
    served (`connectors.us_core.INCLUDES`, `REVINCLUDES` rows)."""

    query: ResourceQuery
    applied: dict
    ignored: tuple[str, ...] = ()
    includes: tuple = ()
    revincludes: tuple = ()
    unmatchable: bool = False


def _criterion(name: str, kind: str, values: list[str], base_url: str) -> Criterion:
    """The neutral `Criterion` of one parameter (its values ANDed for a date, a comma ORs the others)."""
    if kind == "date":
        start, end = date_range(values, name)
        if start and end and start >= end:
            raise Unmatchable()
        return Criterion(name, kind, ((start, end),))
    items = values[0].split(",")
    if len(items) > MAX_OR_VALUES or not all(items):
        raise invalid(f"{name} takes 1 to {MAX_OR_VALUES} comma-separated values, none empty.")
    if kind == "token":
        found = []
        for item in items:
            system, bar, code = item.rpartition("|")
            if not code:
                raise invalid(f"{name} must be [system|]code[,[system|]code...].")
            found.append((system if bar and system else None, code))
        return Criterion(name, kind, tuple(found))
    if kind == "string":
        return Criterion(name, kind, tuple(folded(item) for item in items))
    found = [reference(item, REFERENCE_TYPES, base_url, name, any_type=True) for item in items]
    return Criterion(name, kind, tuple((kind_ or REFERENCE_TARGETS.get(name), ident) for kind_, ident in found))


def _control(name: str, resource_type: str, values: list[str]):
    """The served `_include` / `_revinclude` rows asked for (an unknown one: None, not served)."""
    if name == "_include":
        rows = {row[0]: row for row in INCLUDES.get(resource_type, ())}
    else:
        rows = {row[0]: row for row in REVINCLUDES}
    found = [rows.get(value) for value in values]
    return None if None in found else tuple(dict.fromkeys(found))


def _typed_references(args: dict[str, list[str]], params: dict) -> dict[str, list[str]]:
    """FHIR R4's `:[type]` modifier of a reference parameter read as the type it names:
    `subject:Patient=A,B` is `subject=Patient/A,Patient/B`. Ignored (lenient), it widened the search
    to every subject. Given beside the plain parameter it repeats it (400); a value that is already
    a reference, or a type the parameter cannot name, is a 400 as for the plain parameter."""
    typed = {}
    for name, values in args.items():
        base, colon, modifier = name.partition(":")
        if not (colon and params.get(base, ("",))[0] == "reference" and modifier[:1].isupper()
                and modifier.isalnum() and modifier.isascii()):
            continue
        if any("/" in item for value in values for item in value.split(",")):
            raise invalid(f"{name[:60]} takes ids: its modifier names their type.")
        typed[name] = (base, [",".join(f"{modifier}/{item}" for item in value.split(",")) for value in values])
    if not typed:
        return args
    found: dict[str, list[str]] = {}
    for name, values in args.items():
        base, values = typed.get(name, (name, values))
        if base in found:
            raise invalid(f"The {base} parameter is repeated.")
        found[base] = values
    return found


def parse_search(resource_type: str, args: dict[str, list[str]], base_url: str, strict: bool = False,
                 params: dict | None = None) -> Search:
    """The `Search` of `resource_type` with `args`. A parameter not served for the type (or a
    modifier, or an `_include` not served) is ignored, or with `strict` a 400 naming it (FHIR R4
    "Handling Errors"); a malformed value of a served one is a 400 either way. `params`: the type's
    search parameters when they are not `SEARCH_PARAMS`' (`{}`: only `_id` and the paging controls,
    no `_include`, `_revinclude` nor `_cursor`: e.g. Bulk Data's Groups)."""
    if params is None:
        params = SEARCH_PARAMS[resource_type]
        controls = CONTROL_PARAMS
    else:
        controls = ("_count", "_offset", "_format")
    args = _typed_references(args, params)
    applied, ignored, includes, revincludes = {}, [], (), ()
    for name, values in args.items():
        if name in ("_include", "_revinclude") and name in controls:
            rows = _control(name, resource_type, values)
            if rows is None:
                if strict:
                    raise invalid(f"{name}={values[0][:80]!r} is not served for {resource_type}; served: "
                                  f"{', '.join(r[0] for r in (INCLUDES.get(resource_type, ()) if name == '_include' else REVINCLUDES)) or 'none'}.")
                ignored.append(name)
                continue
            includes, revincludes = (rows, revincludes) if name == "_include" else (includes, rows)
        elif name not in params and name not in ("_id",) + controls:
            if strict:
                supported = ", ".join(("_id",) + tuple(params) + CONTROL_PARAMS[:2])
                raise invalid(f"Unknown search parameter {name[:60]!r} for {resource_type}; supported: {supported}.")
            ignored.append(name)
            continue
        elif len(values) > 1 and params.get(name, ("",))[0] != "date":
            raise invalid(f"The {name} parameter is repeated.")
        applied[name] = values
    try:
        query = _query(resource_type, applied, base_url, params)
    except Unmatchable:
        query, unmatchable = None, True
    else:
        unmatchable = False
    return Search(query, applied, tuple(ignored), includes, revincludes, unmatchable)


def _participants(value: str, name: str, types: tuple[str, ...], base_url: str,
                  default: str | None = None) -> frozenset:
    """The (type, id) pairs a patient or participant parameter ORs (`patient=A,Patient/B`); a bare
    id is of type `default` (none: 400, the type must be named)."""
    items = value.split(",")
    if len(items) > MAX_OR_VALUES or not all(items):
        raise invalid(f"{name} takes 1 to {MAX_OR_VALUES} comma-separated values, none empty.")
    found = set()
    for item in items:
        kind, ident = reference(item, types, base_url, name)
        if (kind or default) is None:
            raise invalid(f"{name} must name its type: {'/{id} or '.join(types)}/{{id}}.")
        found.add((kind or default, ident))
    return frozenset(found)


PARTICIPANTS = (("Patient", "patient"), ("Practitioner", "practitioner"))
"""The neutral query's participants: its field (and the name of a `Criterion` ORing several), by type."""


def _participation(asked: list[frozenset]) -> tuple[dict, tuple[Criterion, ...]]:
    """The neutral query's `patient` and `practitioner` fields, and `Criterion`s, of the participant
    parameters asked (each an OR of (type, id); together ANDed): the patients (practitioners) of the
    parameters naming only patients (practitioners) intersect, one is the field, several a
    `Criterion` of that name; a parameter naming both (`actor=Patient/A,Practitioner/X`) is an
    `actor` `Criterion`. `Unmatchable` when an intersection is empty."""
    fields, criteria = {}, []
    for kind, field in PARTICIPANTS:
        wanted = None
        for found in asked:
            if {k for k, _ in found} == {kind}:
                ids = {ident for _, ident in found}
                wanted = ids if wanted is None else wanted & ids
        if wanted is not None and not wanted:
            raise Unmatchable()
        if wanted is not None and len(wanted) == 1:
            fields[field] = next(iter(wanted))
        elif wanted is not None:
            criteria.append(Criterion(field, "reference", tuple(sorted((kind, ident) for ident in wanted))))
    criteria += [Criterion("actor", "reference", tuple(sorted(found))) for found in asked
                 if len({k for k, _ in found}) > 1]
    return fields, tuple(criteria)


def for_patient(query: ResourceQuery, patient: str) -> ResourceQuery | None:
    """`query` within one patient's compartment (a `patient/` grant's), or None when it asks only
    for other patients (`patient=B`, `patient=B,C`): a `patient` `Criterion` naming them becomes
    the field."""
    if query.patient not in (None, patient):
        return None
    criteria = []
    for criterion in query.criteria:
        if criterion.name == "patient" and criterion.kind == "reference":
            if ("Patient", patient) not in criterion.values:
                return None
            continue
        criteria.append(criterion)
    return dataclasses.replace(query, patient=patient, criteria=tuple(criteria))


def _query(resource_type: str, args: dict[str, list[str]], base_url: str, params: dict) -> ResourceQuery:
    """The `ResourceQuery` of the applied `args` (`params`: the type's search parameters); raises
    `Unmatchable` for a search that cannot match anything."""
    one = {name: values[0] for name, values in args.items()}
    fields: dict = {"resource_type": resource_type}
    if "_id" in one:
        ids = tuple(dict.fromkeys(resource_id(v, "_id") for v in one["_id"].split(",")))
        if len(ids) > MAX_IDS:
            raise invalid(f"_id names at most {MAX_IDS} ids.")
        fields["ids"] = ids
    asked = [_participants(one[name], name, ("Patient",), base_url, "Patient")
             for name in ("patient", "subject") if name in one]
    if "practitioner" in one and not params["practitioner"][1]:
        asked.append(_participants(one["practitioner"], "practitioner", ("Practitioner",), base_url, "Practitioner"))
    if "actor" in one:
        asked.append(_participants(one["actor"], "actor", ("Patient", "Practitioner"), base_url))
    participation = _participation(asked)
    fields.update(participation[0])
    criteria = list(participation[1])
    for name, values in args.items():
        kind, paths = params.get(name, (None, ()))
        if kind is not None and paths:
            criteria.append(_criterion(name, kind, values, base_url))
    fields["criteria"] = tuple(criteria)
    fields["count"] = _integer(one["_count"], "_count", 1, MAX_COUNT) if "_count" in one else DEFAULT_COUNT
    fields["offset"] = _integer(one["_offset"], "_offset", 0, MAX_OFFSET) if "_offset" in one else 0
    if fields["offset"] >= MAX_OFFSET:
        raise invalid(f"_offset must be below {MAX_OFFSET}.")
    return ResourceQuery(**fields)
