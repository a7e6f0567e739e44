"""A clinic's Groups (`GET {iss}/Group`, `{iss}/Group/{id}`): who a Patient or Group export covers.

Each authorized physician of the clinic (a user with an NPI who completed the auth flow of an app
installed there: the physicians whose schedules the nightly snapshot reads) is a Group,
`physician-{user id}`, of the patients on their schedule in every kept (complete) snapshot; the
clinic is the Group `clinic` of all of them. `Patient/$export` (and the system-level export)
covers exactly the clinic's Group. Members are read in pages (`members`): an export's memory does
not grow with the clinic.
"""
from __future__ import annotations

from typing import Iterator

import peewee

from fhir_api.outcome import FhirError
from models.application import Authorization, Installation
from models.appointments import Snapshot, SnapshotAppointment
from models.directory import Organization, User
from models.ids import fhir_id

CLINIC_GROUP = "clinic"
PHYSICIAN_PREFIX = "physician-"
PAGE = 500


def authorized_physicians(organization_id: str) -> list[User]:
    """The clinic's users with an NPI who authorized an app installed in the clinic, by id."""
    installed = Installation.select(Installation.application).where(Installation.organization == organization_id)
    authorized = Authorization.select(Authorization.user).where(Authorization.application.in_(installed))
    return list(User.select().where((User.organization == organization_id) & User.npi.is_null(False)
                                    & (User.npi != "") & User.id.in_(authorized)).order_by(User.id))


def group_id_of(user: User) -> str:
    return PHYSICIAN_PREFIX + fhir_id(user.id)


def _providers(organization_id: str, group_id: str) -> list[str]:
    """The user ids a group's schedules are read from, or 404 for a group the clinic does not have."""
    physicians = authorized_physicians(organization_id)
    if group_id == CLINIC_GROUP:
        return [u.id for u in physicians]
    found = [u.id for u in physicians if group_id_of(u) == group_id]
    if not found:
        raise FhirError(404, "not-found", f"No Group {group_id[:64]!r} here.")
    return found


def check_group(organization_id: str, group_id: str) -> None:
    """404 unless the clinic has the group."""
    _providers(organization_id, group_id)


def members(organization_id: str, group_id: str, page: int = PAGE) -> Iterator[list[str]]:
    """The group's patient ids (R4's spelling), distinct and sorted, in pages of at most `page`."""
    providers = _providers(organization_id, group_id)
    if not providers:
        return
    kept = Snapshot.select(Snapshot.id).where((Snapshot.organization == organization_id) & (Snapshot.status == "complete"))
    after = None
    while True:
        query = (SnapshotAppointment.select(SnapshotAppointment.patient_id).distinct()
                 .where(SnapshotAppointment.snapshot.in_(kept) & SnapshotAppointment.provider.in_(providers)))
        if after is not None:
            query = query.where(SnapshotAppointment.patient_id > after)
        rows = [row[0] for row in query.order_by(SnapshotAppointment.patient_id).limit(page).tuples()]
        if not rows:
            return
        after = rows[-1]
        yield list(dict.fromkeys(fhir_id(p) for p in rows))
        if len(rows) < page:
            return


def member_count(organization_id: str, group_id: str) -> int:
    providers = _providers(organization_id, group_id)
    if not providers:
        return 0
    kept = Snapshot.select(Snapshot.id).where((Snapshot.organization == organization_id) & (Snapshot.status == "complete"))
    return (SnapshotAppointment.select(peewee.fn.COUNT(SnapshotAppointment.patient_id.distinct()))
            .where(SnapshotAppointment.snapshot.in_(kept) & SnapshotAppointment.provider.in_(providers)).scalar() or 0)


def _resource(group_id: str, name: str, organization_id: str) -> dict:
    patients = [p for batch in members(organization_id, group_id) for p in batch]
    group = {"resourceType": "Group", "id": group_id, "active": True, "type": "person", "actual": True,
             "name": name, "quantity": len(patients)}  # no managingEntity: a FHIR EHR's Organization has its own id
    if patients:
        group["member"] = [{"entity": {"reference": f"Patient/{p}"}} for p in patients]
    return group


def group_resource(organization_id: str, group_id: str) -> dict:
    """`GET {iss}/Group/{id}`: the Group with its members, or 404."""
    if group_id == CLINIC_GROUP:
        organization = Organization.get_or_none(Organization.id == organization_id)
        return _resource(group_id, f"Patients of {organization.name if organization else 'the clinic'}",
                         organization_id)
    for user in authorized_physicians(organization_id):
        if group_id_of(user) == group_id:
            return _resource(group_id, f"Patients on the schedule of Dr. {user.display_name}", organization_id)
    raise FhirError(404, "not-found", f"No Group {group_id[:64]!r} here.")


def group_ids(organization_id: str) -> list[str]:
    return [CLINIC_GROUP] + [group_id_of(u) for u in authorized_physicians(organization_id)]
