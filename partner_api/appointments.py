"""`GET /v1/appointments/{svcOrganizationId}`: pages of the latest complete nightly snapshot.

Only appointments of providers who completed this application's auth flow (an `Authorization`
row), only in organizations where the application is installed. Pages are ordered by
(start, row id), a total order within one snapshot, so consecutive pages never overlap or skip;
the snapshot only changes when the next night's one is complete, or when a night is built again
(its snapshot replaced in one transaction: a page read across that commit is read again from the
new one, `_still_latest`).

A page is one round trip: the page query also returns the total (`COUNT(*) OVER ()`, computed
from the rows the sort reads anyway); only a page past the end runs a separate count. The queries
are prepared (models.prepared) and rows come back as dicts, not model objects.
"""
from __future__ import annotations

import re

import peewee

from connectors.base import fhir_status
from models.application import Application, Authorization
from models.appointments import Snapshot, SnapshotAppointment
from models.clock import utc_iso
from models.directory import User
from models.prepared import PreparedQuery
from errors import ApiError
from partner_api import testdata
from lifecycle.activation import USE
from partner_api.access import installation_of, path_id

DEFAULT_LIMIT = 50
MAX_LIMIT = 50
MAX_OFFSET = 2**31 - 1
_INTEGER = re.compile(r"[0-9]{1,10}")  # ASCII digits, matched whole


def _integer(name: str, raw: str | None, default: int, low: int, high: int) -> int:
    if raw is None:
        return default
    if not _INTEGER.fullmatch(raw) or not low <= int(raw) <= high:
        raise ApiError(400, "invalid_pagination", f"{name} must be an integer from {low} to {high}, got {raw!r}.")
    return int(raw)


def page_params(query: dict) -> tuple[int, int]:
    """(offset, limit) from the query: offset >= 0 (default 0), 1 <= limit <= 50 (default 50)."""
    offset = _integer("offset", query.get("offset"), 0, 0, MAX_OFFSET)
    limit = _integer("limit", query.get("limit"), DEFAULT_LIMIT, 1, MAX_LIMIT)
    return offset, limit


def appointment_json(row: dict) -> dict:
    """One appointment as the API shows it, from a row of `SnapshotAppointment` as a dict."""
    return {
        "id": row["ehr_appointment_id"], "start": utc_iso(row["start"]), "end": utc_iso(row["end"]),
        "status": fhir_status(row["status"]), "appointment_type": row["appointment_type"], "reason": row["reason"],
        "location": row["location"],
        "provider": {"user_id": row["provider"], "npi": row["provider_npi"], "name": row["provider_name"]},
        "patient": {"id": row["patient_id"], "first_name": row["patient_first_name"],
                    "last_name": row["patient_last_name"], "date_of_birth": row["patient_date_of_birth"].isoformat(),
                    "sex": row["patient_sex"]},
    }


def snapshot_rows(application_id: str, snapshot_id: int, organization_id: str):
    """The rows of a snapshot the application may read: those of providers who authorized it.

    A snapshot only holds providers of its organization, so the authorizations looked at are those
    of that organization's users: a few dozen rows, not every authorization of the application
    (with 20,000 of them PostgreSQL hashed them all: 8 ms a page at 1M rows; now ~1 ms).
    """
    authorized = (Authorization.select(Authorization.user).join(User)
                  .where((Authorization.application == application_id) & (User.organization == organization_id)))
    return SnapshotAppointment.select().where(
        (SnapshotAppointment.snapshot == snapshot_id) & SnapshotAppointment.provider.in_(authorized))


def page_of(rows, offset: int, limit: int):
    """One page of `rows` in the total order (start, id) that keeps pages from overlapping."""
    return rows.order_by(SnapshotAppointment.start, SnapshotAppointment.id).offset(offset).limit(limit)


_ROW_NUMBER = peewee.IntegerField()  # converts the offset and limit arguments
_PAGE_WITH_TOTAL = PreparedQuery(
    lambda application_id, snapshot_id, organization_id, offset, limit: page_of(
        snapshot_rows(application_id, snapshot_id, organization_id).select_extend(
            peewee.fn.COUNT(peewee.SQL("*")).over().alias("total_rows")), offset, limit).dicts(),
    Authorization.application, SnapshotAppointment.snapshot, User.organization, _ROW_NUMBER, _ROW_NUMBER)
_TOTAL = PreparedQuery(
    lambda application_id, snapshot_id, organization_id: snapshot_rows(
        application_id, snapshot_id, organization_id).select(
        peewee.fn.COUNT(peewee.SQL("*")).alias("total_rows")).dicts(),
    Authorization.application, SnapshotAppointment.snapshot, User.organization)


def appointments_page(runtime, app: Application, organization_id: str, query: dict) -> dict:
    path_id("svcOrganizationId", organization_id)
    offset, limit = page_params(query)
    if organization_id == testdata.TEST_ORGANIZATION_ID:
        return testdata.appointments_page(runtime.clock.now().date(), offset, limit)
    installation_of(app, organization_id, "svcOrganizationId", USE)
    for _ in range(REREADS):
        snapshot = Snapshot.latest_complete(organization_id)
        if snapshot is None:
            return {"appointments": [], "offset": offset, "limit": limit, "total": 0, "snapshot_date": None}
        page = _PAGE_WITH_TOTAL.dicts(app.id, snapshot.id, organization_id, offset, limit)
        if page:
            total = page[0]["total_rows"]
            break
        total = _TOTAL.dicts(app.id, snapshot.id, organization_id)[0]["total_rows"]
        if _still_latest(snapshot, organization_id):
            break
    return {"appointments": [appointment_json(row) for row in page], "offset": offset, "limit": limit,
            "total": total, "snapshot_date": snapshot.snapshot_date.isoformat()}


REREADS = 3
"""Reads of a page whose snapshot was replaced between its lookup and its rows (see `_still_latest`)."""


def _still_latest(snapshot: Snapshot, organization_id: str) -> bool:
    """Is `snapshot` still the latest complete one? A night published again replaces its snapshot
    in one transaction: a page whose lookup came before that commit and its rows after finds no
    rows (every row goes at once, so a page with rows is all of one snapshot). Only an empty page
    asks; when it was replaced, the page is read again from the new one."""
    latest = Snapshot.latest_complete(organization_id)
    return latest is not None and latest.id == snapshot.id
