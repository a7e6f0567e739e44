"""The service's clock: what time it is, so tests can move it. The runtime owns one (`runtime.clock`).

Times are naive UTC `datetime`s everywhere in the database; `Clock.now()` returns one.
"""
from __future__ import annotations

import datetime as dt
import time


class Clock:
    """Wall clock with an adjustable offset (tests advance it instead of sleeping)."""

    def __init__(self, offset_seconds: float = 0.0):
        self.offset = offset_seconds

    def time(self) -> float:
        return time.time() + self.offset

    def now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.time(), dt.timezone.utc).replace(tzinfo=None)

    def advance(self, seconds: float) -> None:
        self.offset += seconds


def utc_iso(value: dt.datetime | None) -> str | None:
    """ISO 8601 with a `Z`, as every API response shows times."""
    if value is None:
        return None
    return value.replace(microsecond=0).isoformat() + "Z"
