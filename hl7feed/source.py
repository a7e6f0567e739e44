"""The night's schedule source of a clinic on `--schedule-source siu`: its feed's appointments.

The same rules as any clinic's night: appointments starting in the window, of the physician with
that NPI, in a listed status (`connectors.LISTED_STATUSES`). A patient's id is R4-valid and stable
for one PID-3 identifier: on a clinic on `--ehr fhir`, the id of the EHR's Patient with that
identifier (so a chart request for it works); elsewhere a digest of the clinic and the identifier.
What cannot be listed is skipped and named (`Skipped`), as a connector's night does.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import re
from typing import Iterator

from connectors import (LISTED_STATUSES, Appointment, Bounds, Criterion, Patient, Provider, ResourceQuery, Skipped,
                        connector_for)
from hl7feed.store import prune
from models.hl7 import FeedAppointment
from models.ids import R4_ID

_OID = re.compile(r"^[0-2](\.(0|[1-9][0-9]*))+$")
MATCHES_READ = 50  # Patients of one identifier search looked at before giving up


def identifier_system(authority: str) -> str | None:
    """CX.4 as a FHIR identifier system: an OID as `urn:oid:`, a URI as it is, else None (any system)."""
    if _OID.fullmatch(authority):
        return f"urn:oid:{authority}"
    if ":" in authority:
        return authority
    return None


def _digest_id(prefix: str, *parts: str) -> str:
    return prefix + "-" + hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]


class FeedSource:
    def __init__(self, runtime, organization, bounds: Bounds, recorder=None):
        self.runtime = runtime
        self.organization = organization
        self.skipped = Skipped()
        self.ehr = connector_for(runtime, organization, bounds, recorder) if organization.ehr == "fhir" else None
        self._patients: dict[tuple[str, str], str | None] = {}
        prune(runtime, runtime.clock.now(), organization.id)  # what no snapshot needs any more

    def finish_night(self) -> None:
        """Nothing to refuse: the feed's rows are what the night publishes."""

    def fetch_appointments(self, provider: Provider, start: dt.datetime, end: dt.datetime) -> Iterator[Appointment]:
        rows = (FeedAppointment.select()
                .where((FeedAppointment.organization == self.organization.id)
                       & (FeedAppointment.physician_npi == provider.npi) & (FeedAppointment.removed == False)  # noqa: E712
                       & (FeedAppointment.start >= start) & (FeedAppointment.start < end)
                       & FeedAppointment.status.in_(LISTED_STATUSES))
                .order_by(FeedAppointment.start, FeedAppointment.key))
        for row in rows.iterator():
            appointment = self._appointment(row)
            if appointment is not None:
                yield appointment

    def _appointment(self, row: FeedAppointment) -> Appointment | None:
        appointment_id = row.key if R4_ID.fullmatch(row.key) else _digest_id("apt", self.organization.id, row.key)
        if not row.patient_identifier:
            self.skipped.add("no patient identifier (PID-3)", appointment_id)
            return None
        if row.patient_date_of_birth is None:
            self.skipped.add("no birth date (PID-7)", appointment_id)
            return None
        patient_id = self._patient_id(row, appointment_id)
        if patient_id is None:
            return None
        patient = Patient(id=patient_id, first_name=row.patient_first_name, last_name=row.patient_last_name,
                          date_of_birth=row.patient_date_of_birth, sex=row.patient_sex)
        return Appointment(id=appointment_id, start=row.start, end=row.end, status=row.status,
                           appointment_type=row.appointment_type, reason=row.reason, location=row.location,
                           patient=patient)

    def _patient_id(self, row: FeedAppointment, appointment_id: str) -> str | None:
        if self.ehr is None:
            return _digest_id("pat", self.organization.id, row.patient_authority, row.patient_identifier)
        key = (row.patient_authority, row.patient_identifier, row.patient_date_of_birth)
        if key not in self._patients:
            self._patients[key] = self._ehr_patient(*key)
        found = self._patients[key]
        if found is None:
            self.skipped.add("patient not found in the EHR", appointment_id)
        elif found == "":
            self.skipped.add("patient identifier names several Patients in the EHR", appointment_id)
        return found or None

    def _ehr_patient(self, authority: str, value: str, born: dt.date) -> str | None:
        """The id of the one EHR Patient with this identifier; None: none; "": several. An identifier
        without a system (CX.4 a namespace, such as `EPI`) matches a value in any system, so it names
        only a Patient born on PID-7's date: another patient whose value in another system happens
        to be the same is not taken for this one."""
        system = identifier_system(authority)
        query = ResourceQuery("Patient", criteria=(Criterion("identifier", "token", ((system, value),)),))
        ids = []
        for resource in itertools.islice(self.ehr.search_resources(query), MATCHES_READ):
            if resource.get("resourceType") != "Patient" or not isinstance(resource.get("id"), str):
                continue
            for identifier in resource.get("identifier") or ():
                if (isinstance(identifier, dict) and identifier.get("value") == value
                        and (identifier.get("system") == system if system is not None
                             else resource.get("birthDate") == born.isoformat())):
                    if resource["id"] not in ids:
                        ids.append(resource["id"])
                    break
            if len(ids) > 1:
                return ""
        return ids[0] if ids else None
