"""FHIR's grammars svc-auth reads: the name of a resource type, and a date or dateTime.

`RESOURCE_TYPE` is the only grammar of a resource type's name anywhere in svc-auth (a FHIR API
path, a SMART scope's type, a type the FHIR connector searches): an ASCII capital and 1 to 63
more ASCII letters (`Patient`, `DocumentReference`), never more than 64 in all. Which types are
*served* is `connectors.us_core`'s; a name of the right shape is only a name.

`DATE` is the only grammar of a FHIR date or dateTime as svc-auth reads one (a resource's date, a
search's date value less its comparator prefix, which is the search's own): `YYYY`, `YYYY-MM`,
`YYYY-MM-DD`, or a day with `Thh:mm[:ss[.fraction]]` and an optional zone (`Z`, `+hh:mm`).
Each is matched whole, digits `0-9` only (never `\\d`, which also takes Arabic-Indic and other
Unicode digits that `int()` then reads as a year; nor `$`, which lets a trailing newline through).
What a date *means* (the period it covers) is its reader's: `connectors.matching.period` for a
resource's date, `fhir_api.search` for a search value's; `fhir_day` reads a date that is a day (a
birthDate).
"""
from __future__ import annotations

import datetime as dt
import re

RESOURCE_TYPE = re.compile(r"[A-Z][A-Za-z]{1,63}")
"""A FHIR resource type's name (matched whole)."""
DATE = re.compile(r"([0-9]{4})(?:-([0-9]{2})(?:-([0-9]{2})(?:T([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]{1,9}))?)?"
                  r"(Z|[+-][0-9]{2}:[0-9]{2})?)?)?)?")
"""A FHIR date or dateTime (matched whole); groups: year, month, day, hour, minute, second, fraction, zone."""


def is_resource_type(value) -> bool:
    """Is `value` shaped as a resource type's name (a string that matches `RESOURCE_TYPE` whole)?"""
    return isinstance(value, str) and RESOURCE_TYPE.fullmatch(value) is not None


def date_parts(value) -> tuple[str | None, ...] | None:
    """(year, month, day, hour, minute, second, fraction, zone) of a FHIR date or dateTime, the
    parts it leaves out None; None when `value` is not one (a string that matches `DATE` whole)."""
    match = DATE.fullmatch(value) if isinstance(value, str) else None
    return match.groups() if match else None


def fhir_day(value) -> dt.date | None:
    """The day a FHIR date `YYYY-MM-DD` names; None for anything else (another precision, a
    dateTime, an impossible day such as `1970-02-30`, or what Python's ISO parser alone would take,
    `1970-W01-1`)."""
    parts = date_parts(value)
    if parts is None or parts[2] is None or parts[3] is not None:
        return None
    try:
        return dt.date(int(parts[0]), int(parts[1]), int(parts[2]))
    except ValueError:
        return None
