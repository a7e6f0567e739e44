"""A clinic's time zone (`Organization.time_zone`): an IANA name, checked against the system's
time zone database. An HL7 feed's or Epic's web service's times without an offset are in it."""
from __future__ import annotations

import datetime as dt
import zoneinfo

DEFAULT_TIME_ZONE = "UTC"


def check_time_zone(name) -> str:
    """`name` when it is an IANA time zone the system knows (`America/Chicago`, `UTC`), else ValueError."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError("a time zone needs an IANA name such as America/Chicago")
    name = name.strip()
    if len(name) > 64 or "\x00" in name:
        raise ValueError(f"{name[:64]!r} is not an IANA time zone name")
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"{name!r} is not an IANA time zone (e.g. America/Chicago, Europe/Paris, UTC)") from None
    return name


def zone_named(name: str | None) -> zoneinfo.ZoneInfo:
    """The ZoneInfo of a stored name (UTC when empty: a row written before the column existed)."""
    return zoneinfo.ZoneInfo(name or DEFAULT_TIME_ZONE)


def local_to_utc(local: dt.datetime, zone: zoneinfo.ZoneInfo) -> dt.datetime:
    """A naive local wall time in `zone` as naive UTC (the database's convention). An ambiguous time
    (the hour repeated when clocks go back) is its first occurrence (PEP 495 `fold=0`)."""
    return local.replace(tzinfo=zone).astimezone(dt.timezone.utc).replace(tzinfo=None)
