"""The connector interface: what every EHR connector returns and raises (see `connectors`)."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Collection, Iterator, Protocol


class ConnectorError(Exception):
    """A permanent failure: retrying will not help. The message is shown to API callers."""


class ConnectorUnavailable(ConnectorError):
    """The EHR did not answer (timeout, outage): the task is retried with backoff."""


class BoundExceeded(ConnectorError):
    """The EHR made a request go past one of the caller's `Bounds` (its size, its pages, a repeated
    or foreign `next` link, a redirect): the FHIR API answers 502, the night fails for the clinic.
    `bound` names it (`max_bytes`, `json_values`, `max_pages`, `repeated_next`, `outside_base`, `redirect`...)."""

    def __init__(self, bound: str, message: str):
        super().__init__(f"{message} [bound: {bound}]")
        self.bound = bound


class DeadlineExceeded(BoundExceeded):
    """The EHR did not answer within the caller's deadline (retries included): the FHIR API answers 504."""


class EhrReportedError(ConnectorError):
    """The EHR answered an OperationOutcome of severity `error` or `fatal` where a resource or a
    searchset belongs: a failure (502 in the FHIR API), never an empty result."""


class PatientNotFound(ConnectorError):
    """The EHR has no such patient in this organization."""


class ResourceNotFound(ConnectorError):
    """The EHR has no such resource in this organization (the FHIR API answers 404)."""


class TypeNotGranted(ConnectorError):
    """The clinic's EHR has not granted svc-auth access to `resource_type` (the FHIR API answers
    403 `forbidden`; an `_include`/`_revinclude` of it becomes an OperationOutcome entry)."""

    resource_type: str = ""


NO_VALID_ID = "resource without a valid id"
"""The `Skipped` reason of a resource an EHR answered without an id, or with one that is no FHIR id
(`models.ids`): it cannot be served (its URL would be invalid), so a search leaves it out."""


class Skipped:
    """What a connector read from the EHR and left out, by reason: a count and the first ids
    (`KEEP`), e.g. an appointment whose start is not an instant. A connector may expose one as
    `skipped`; the night's report and log carry it."""

    KEEP = 5

    def __init__(self):
        self.reasons: dict[str, dict] = {}

    def add(self, reason: str, item_id=None) -> None:
        entry = self.reasons.setdefault(reason, {"count": 0, "appointments": []})
        entry["count"] += 1
        if isinstance(item_id, str) and item_id and len(entry["appointments"]) < self.KEEP:
            entry["appointments"].append(item_id[:64])

    def count(self, reason: str) -> int:
        """How many were left out for `reason`."""
        return self.reasons[reason]["count"] if reason in self.reasons else 0

    def as_dict(self) -> dict:
        return {reason: {"count": e["count"], "appointments": list(e["appointments"])}
                for reason, e in sorted(self.reasons.items())}

    def total(self) -> int:
        return sum(e["count"] for e in self.reasons.values())


@dataclass(frozen=True)
class Provider:
    user_id: str
    npi: str
    name: str
    ehr_username: str | None = None


@dataclass(frozen=True)
class Patient:
    id: str
    first_name: str
    last_name: str
    date_of_birth: dt.date
    sex: str


APPOINTMENT_STATUSES = ("proposed", "pending", "booked", "arrived", "fulfilled", "cancelled", "noshow",
                        "entered-in-error", "checked-in", "waitlist")
"""FHIR R4 AppointmentStatus codes: an `Appointment.status` is one of them, whatever the EHR."""
LISTED_STATUSES = ("proposed", "pending", "booked", "arrived", "checked-in")
"""The statuses of appointments that are listed (snapshot, REST API): still expected to take place.
`cancelled`, `noshow`, `entered-in-error`, `fulfilled` and `waitlist` are not."""
LEGACY_STATUSES = MappingProxyType({"confirmed": "booked"})
"""Statuses that snapshots built before every status was a FHIR code may hold, as FHIR codes."""


def fhir_status(status: str) -> str:
    """An appointment status as a FHIR AppointmentStatus code (a stored legacy value mapped)."""
    return LEGACY_STATUSES.get(status, status)


@dataclass(frozen=True)
class Appointment:
    """An appointment; `status` is a FHIR AppointmentStatus code (`APPOINTMENT_STATUSES`)."""

    id: str
    start: dt.datetime
    end: dt.datetime
    status: str
    appointment_type: str
    reason: str
    location: str
    patient: Patient


@dataclass(frozen=True)
class Encounter:
    date: dt.date
    encounter_type: str
    provider: str
    reason: str
    vitals: dict
    assessment: str
    plan: str
    id: str = ""  # the EHR's id, when the EHR has one


@dataclass
class Chart:
    """A patient's chart. `encounters()`, `observations()` and `documents()` can be called more
    than once and may stream (a source is an iterable, or a callable returning one).

    An observation is a dict `{id, date, category, code, name, value, unit, interpretation}` (a
    vital sign or a lab result: `value` and `unit` as text), a document a dict `{id, date, title,
    type, category, status, content_type}` (what the document is, never its content)."""

    patient: Patient
    organization_name: str
    problems: Collection[dict] = field(default_factory=list)
    """Problems, medications, allergies: lists, or the FHIR spool's collections read from disk."""
    medications: Collection[dict] = field(default_factory=list)
    allergies: Collection[dict] = field(default_factory=list)
    encounter_source: object = None
    observation_source: object = None
    document_source: object = None
    omitted: list[dict] = field(default_factory=list)
    """Resource types the EHR refused to this chart, each `{"resourceType", "reason"}`."""

    def encounters(self) -> Iterator[Encounter]:
        return _iterate(self.encounter_source)

    def observations(self) -> Iterator[dict]:
        return _iterate(self.observation_source)

    def documents(self) -> Iterator[dict]:
        return _iterate(self.document_source)


def _iterate(source) -> Iterator:
    return iter(source() if callable(source) else (source or ()))


@dataclass(frozen=True)
class Criterion:
    """One more condition of a `ResourceQuery`, in neutral terms: the search parameter `name` of the
    type (`connectors.us_core.SEARCH_PARAMS`: its kind and the elements it reads) and its values,
    any of which may match (OR). By kind: `token` ((system or None, code), ...); `string`
    (lower-case prefixes, ...); `reference` ((type or None, id), ...); `date` ((start, end),): the
    resource's date overlaps [start, end), naive UTC, either end open (None)."""

    name: str
    kind: str
    values: tuple


@dataclass(frozen=True)
class ResourceQuery:
    """A search of one resource type, in neutral terms; every field given must match.

    `patient`: resources of this patient (for Patient: the patient itself); `practitioner`: for
    Appointment, those the practitioner takes part in (for Practitioner: itself); `npi`: the
    Practitioner with this NPI; `start`/`end`: the resource's date (Appointment start, Encounter
    period start, Observation effective, Condition onset/recorded) in [start, end), naive UTC;
    `ids`: only these resource ids; `criteria`: `Criterion`s, all of which must match.
    `offset`/`count`: the page wanted."""

    resource_type: str
    ids: tuple[str, ...] = ()
    patient: str | None = None
    practitioner: str | None = None
    npi: str | None = None
    start: dt.datetime | None = None
    end: dt.datetime | None = None
    criteria: tuple[Criterion, ...] = ()
    offset: int = 0
    count: int = 50


class Connector(Protocol):
    answers_matched: bool = False
    """True when `search_resources` yields only resources that `connectors.matching.matches` accepts
    for the very query given (the sandbox searches with it): the FHIR API then does not check each
    one a second time. A connector to a real EHR leaves it False: its answers pass the matcher."""

    def fetch_appointments(self, provider: Provider, start: dt.datetime, end: dt.datetime) -> Iterator[Appointment]:
        ...

    def fetch_chart(self, patient_id: str) -> Chart:
        ...

    reads_on_loop: bool = False
    """True when the connector also has `read_later`: a read whose exchange with the EHR the
    IOLoop finishes (`audit.disclosures.Later`), so no pool thread waits on the EHR."""

    def read_resource(self, resource_type: str, resource_id: str) -> dict:
        ...

    def read_later(self, resource_type: str, resource_id: str):
        """Only when `reads_on_loop`: `read_resource`, prepared here (blocking), its exchange left
        to the IOLoop -> `read(offload)`, a coroutine function giving what `read_resource` gives."""
        ...

    def user_practitioner(self, provider: Provider) -> str | None:
        ...

    def search_resources(self, query: ResourceQuery) -> Iterator[dict]:
        ...
