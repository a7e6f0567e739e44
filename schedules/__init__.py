"""Where the night reads a clinic's schedule: one interface, whichever source it is.

`schedule_source(runtime, organization, bounds, recorder)` returns a `ScheduleSource`:
- `fetch_appointments(provider, start, end)`: the physician's listed appointments starting in
  [start, end) (naive UTC), as `connectors.Appointment`s, each once;
- `skipped`: a `connectors.Skipped` of what the source had but left out, or None;
- `finish_night()`: after the night's last physician, a `ConnectorError` when what it read cannot
  be published (an Epic clinic whose every Patient read was refused), so the night fails.

A clinic on `--schedule-source ehr` (the default) is pulled from its EHR by its connector
(`EhrPull`: the FHIR search, the sandbox, and what a connector does for its vendor); one on `siu`
is read from what its HL7v2 SIU feed pushed (`hl7feed.source.FeedSource`). `workers.snapshot`
builds the same snapshot from either, and `hub.view` lists a physician's upcoming appointments from
it, neither knowing which it has.
"""
from __future__ import annotations

import datetime as dt
from typing import Iterator, Protocol

from connectors import Appointment, Bounds, Provider, Skipped, connector_for


class ScheduleSource(Protocol):
    skipped: Skipped | None

    def fetch_appointments(self, provider: Provider, start: dt.datetime, end: dt.datetime) -> Iterator[Appointment]:
        ...

    def finish_night(self) -> None:
        ...


class EhrPull:
    """The clinic's EHR connector, asked for each physician's appointments."""

    def __init__(self, connector):
        self.connector = connector

    @property
    def skipped(self) -> Skipped | None:
        return getattr(self.connector, "skipped", None)

    def fetch_appointments(self, provider: Provider, start: dt.datetime, end: dt.datetime) -> Iterator[Appointment]:
        """The connector's appointments, each id once: an EHR's offset paging shows an appointment on
        two pages when the schedule changes between them (the later copy is left out)."""
        seen: set[str] = set()
        for appointment in self.connector.fetch_appointments(provider, start, end):
            if appointment.id not in seen:
                seen.add(appointment.id)
                yield appointment

    def finish_night(self) -> None:
        finish = getattr(self.connector, "finish_night", None)   # the FHIR connector's (Epic); others have none
        if finish is not None:
            finish()


def schedule_source(runtime, organization, bounds: Bounds, recorder=None) -> ScheduleSource:
    """The organization's schedule source (module docstring)."""
    if organization.schedule_source == "siu":
        from hl7feed.source import FeedSource
        return FeedSource(runtime, organization, bounds, recorder)
    return EhrPull(connector_for(runtime, organization, bounds, recorder))
