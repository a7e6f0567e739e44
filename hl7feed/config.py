"""A clinic's feed settings: where its night reads its schedule, which HL7 facility it is, from
which addresses its messages may come, and over which client certificates (subject CN)."""
from __future__ import annotations

import ipaddress
import json
import re

import peewee

from errors import ApiError
from models.audit import AuditEvent
from models.directory import Organization

SCHEDULE_SOURCES = ("ehr", "siu")
# A facility is matched exactly against MSH-4's first component (escapes decoded): printable, no
# HL7 delimiter, 1-200 characters.
_FACILITY = re.compile(r"^[^|^~\\&\x00-\x1f\x7f]{1,200}$")
# A client certificate subject's CN as `--hl7-client-subject` names it: printable, no comma (the
# flag's list separator), 1-200 characters, compared exactly.
_SUBJECT = re.compile(r"^[^,\x00-\x1f\x7f]{1,200}$")
MAX_SUBJECTS = 20


def _invalid(message: str) -> ApiError:
    return ApiError(400, "invalid_request", message)


def allowed_networks(org: Organization) -> list[str]:
    """The clinic's `--hl7-allow` networks, as stored (validated on the way in)."""
    try:
        return list(json.loads(org.hl7_allow or "[]"))
    except ValueError:
        return []


def client_subjects(org: Organization) -> list[str]:
    """The clinic's `--hl7-client-subject` CNs, as stored (validated on the way in)."""
    try:
        return list(json.loads(org.hl7_client_subjects or "[]"))
    except ValueError:
        return []


def clean_subjects(values) -> list[str]:
    """`--hl7-client-subject` values (each one CN or a comma list; '' alone clears the list)."""
    subjects = []
    for value in values:
        for name in str(value).split(","):
            name = name.strip()
            if not name:
                continue
            if not _SUBJECT.fullmatch(name):
                raise _invalid("--hl7-client-subject must be certificate subject CNs of 1 to 200 printable characters")
            if name not in subjects:
                subjects.append(name)
    if len(subjects) > MAX_SUBJECTS:
        raise _invalid(f"--hl7-client-subject takes at most {MAX_SUBJECTS} names")
    return subjects


def clean_networks(values) -> list[str]:
    networks = []
    for value in values:
        try:
            network = str(ipaddress.ip_network(str(value).strip(), strict=False))
        except ValueError:
            raise _invalid(f"--hl7-allow {value!r} is not an IP network (CIDR, e.g. 203.0.113.0/24)") from None
        if network not in networks:
            networks.append(network)
    return networks


def configure_feed(organization_id: str, schedule_source: str | None = None, facility: str | None = None,
                   allow=None, actor: str = "operator", subjects=None) -> Organization | None:
    """Set the clinic's schedule source, HL7 facility ('' clears it), allowed networks and client
    certificate subjects (None: unchanged); audited. A clinic on `siu` needs a facility. None when
    nothing was given."""
    if schedule_source is None and facility is None and allow is None and subjects is None:
        return None
    org = Organization.get_or_none(Organization.id == organization_id)
    if org is None:
        raise ApiError(404, "organization_not_found", f"No organization has id {organization_id!r}.")
    changes: dict = {}
    if schedule_source is not None:
        if schedule_source not in SCHEDULE_SOURCES:
            raise _invalid(f"schedule_source must be one of {', '.join(SCHEDULE_SOURCES)}.")
        changes["schedule_source"] = schedule_source
    if facility is not None:
        facility = facility.strip()
        if facility and not _FACILITY.fullmatch(facility):
            raise _invalid("--hl7-facility must be 1 to 200 printable characters without an HL7 delimiter (|^~\\&).")
        changes["hl7_facility"] = facility or None
    if allow is not None:
        changes["hl7_allow"] = json.dumps(clean_networks(allow))
    if subjects is not None:
        changes["hl7_client_subjects"] = json.dumps(clean_subjects(subjects))
    if changes.get("schedule_source", org.schedule_source) == "siu" and not changes.get("hl7_facility",
                                                                                        org.hl7_facility):
        raise _invalid("A clinic whose schedule comes from the SIU feed needs its sending facility (--hl7-facility).")
    try:
        with Organization._meta.database.atomic():
            Organization.update(**changes).where(Organization.id == org.id).execute()
    except peewee.IntegrityError:
        raise _invalid(f"The HL7 facility {changes.get('hl7_facility')!r} is another organization's.") from None
    AuditEvent.record(actor, "organization.feed_updated", org.id, **changes)
    return Organization.get_by_id(org.id)


def feed_dict(org: Organization) -> dict:
    return {"schedule_source": org.schedule_source, "hl7_facility": org.hl7_facility,
            "hl7_allow": allowed_networks(org), "hl7_client_subjects": client_subjects(org)}
