"""The sandbox EHR's FHIR side: `read_resource` and `search_resources` over the generator.

What exists: the clinic's synthetic patients (`patient_panel`), its physicians (users with an NPI)
as Practitioners (id = the user id), their appointments over a bounded window around today
(`fetch_appointments`, as the EHR shows them today), and each patient's chart (`fetch_chart`):
Encounters, their vital signs as Observations, Conditions, MedicationRequests and
AllergyIntolerances. Every id is R4's type (`models.ids.sandbox_id`): a patient `pat-{hex}`, a
Practitioner the user id in R4's spelling (`usr-…`, `models.ids.fhir_id`), chart resources
`{kind}-{patient hex}-{n}` (an Observation adds `-{vital}`), so a read finds its patient without a
scan; ids are never reused across kinds. The FHIR API hands ids in already normalised (an old
`pat_…` spelling is read as `pat-…`: `fhir_api.search.resource_id`).
Rendering to FHIR is `connectors.fhir_render`'s.
"""
from __future__ import annotations

import datetime as dt
import itertools
import re
from types import MappingProxyType

from connectors import fhir_render
from connectors.base import PatientNotFound, Provider, ResourceNotFound, ResourceQuery
from connectors.matching import matches
from models.ids import fhir_id, sandbox_id

APPOINTMENT_PAST_DAYS = 30     # appointments the FHIR API shows: from today - 30 days ...
APPOINTMENT_FUTURE_DAYS = 90   # ... to today + 90 days
CHART_KINDS = (("Encounter", "enc"), ("Condition", "cnd"), ("Observation", "obs"),
               ("MedicationRequest", "med"), ("AllergyIntolerance", "alg"))
_KINDS = MappingProxyType(dict(CHART_KINDS))
_CHART_ID = re.compile(r"^(enc|cnd|obs|med|alg)-([0-9a-f]{16})-(\d{1,4})(?:-(%s))?$" % "|".join(fhir_render.VITAL_SUFFIXES))


PATIENT_PREFIX = sandbox_id("pat", "")
"""`pat-`: a sandbox patient id is this and 16 hex digits."""


def patient_key(patient_id: str) -> str:
    """The hex of a sandbox patient id (`pat-{hex}`; the first release's `pat_{hex}` too)."""
    return patient_id[len(PATIENT_PREFIX):]


class SandboxFhir:
    """Mixed into `SandboxConnector` (which has `organization_id`, `now()`, `_call()`,
    `physicians()`, `fetch_appointments` and `fetch_chart`)."""

    # -- read --------------------------------------------------------------------------------
    def read_resource(self, resource_type: str, resource_id: str) -> dict:
        self._call()
        found = None
        if resource_type == "Patient":
            found = next(self._patients((resource_id,)), None)
        elif resource_type == "Practitioner":
            found = next((r for r in self._practitioners() if r["id"] == resource_id), None)
        elif resource_type == "Appointment":
            found = next((r for r in self._appointments(None, None, None, None) if r["id"] == resource_id), None)
        elif _KINDS.get(resource_type):
            match = _CHART_ID.match(resource_id)
            if match and match.group(1) == _KINDS.get(resource_type):
                found = next((r for r in self._chart_resources(resource_type, sandbox_id("pat", match.group(2)))
                              if r["id"] == resource_id), None)
        if found is None:
            raise ResourceNotFound(f"No {resource_type} {resource_id!r} in this organization.")
        return found

    # -- search ------------------------------------------------------------------------------
    def search_resources(self, query: ResourceQuery):
        """The matches from `query.offset` on, in a stable order (lazily)."""
        self._call()
        return itertools.islice(self._matches(query), query.offset, None)

    def _matches(self, query: ResourceQuery):
        """The candidates the generator can narrow to cheaply, then the one matcher decides
        (`connectors.matching.matches`): the sandbox searches as the FHIR API and charts match."""
        kind = query.resource_type
        if kind == "Patient":
            wanted = set(query.ids) | ({query.patient} if query.patient else set())
            found = self._patients(wanted or None)
        elif kind == "Practitioner":
            found = iter(self._practitioners())
        elif kind == "Appointment":
            found = self._appointments(query.practitioner, query.patient, query.start, query.end)
        elif _KINDS.get(kind):
            patients = (query.patient,) if query.patient else [p.id for p in self.panel()]
            found = (r for pid in patients for r in self._chart_resources(kind, pid))
        else:
            return iter(())
        return (r for r in found if matches(r, query))

    # -- resources ---------------------------------------------------------------------------
    def _patients(self, wanted):
        system = f"urn:svc-auth:sandbox:{self.organization_id}:patient"
        return (fhir_render.patient(p, system) for p in self.panel() if wanted is None or p.id in wanted)

    def _practitioners(self):
        return [fhir_render.practitioner(fhir_id(u.id), u.given_name, u.family_name, u.npi) for u in self.physicians()]

    def _appointments(self, practitioner_id, patient_id, start, end):
        today = dt.datetime.combine(self.now().date(), dt.time())
        window_start = today - dt.timedelta(days=APPOINTMENT_PAST_DAYS)
        window_end = today + dt.timedelta(days=APPOINTMENT_FUTURE_DAYS)
        start, end = max(start or window_start, window_start), min(end or window_end, window_end)
        found = []
        for user in self.physicians():
            if practitioner_id and fhir_id(user.id) != practitioner_id:
                continue
            provider = Provider(user_id=user.id, npi=user.npi, name=user.display_name, ehr_username=user.ehr_username)
            for appointment in self.fetch_appointments(provider, start, end, as_of=today):
                if not patient_id or appointment.patient.id == patient_id:
                    found.append(fhir_render.appointment(appointment, fhir_id(user.id), f"Dr. {user.display_name}"))
        found.sort(key=lambda r: (r["start"], r["id"]))
        return iter(found)

    def _chart_resources(self, resource_type: str, patient_id: str):
        try:
            chart = self.fetch_chart(patient_id)
        except PatientNotFound:
            return
        key = patient_key(patient_id)
        if resource_type == "Condition":
            for n, problem in enumerate(chart.problems):
                yield fhir_render.condition(sandbox_id("cnd", key, n), patient_id, problem)
        elif resource_type == "MedicationRequest":
            for n, medication in enumerate(chart.medications):
                yield fhir_render.medication_request(sandbox_id("med", key, n), patient_id, medication)
        elif resource_type == "AllergyIntolerance":
            for n, allergy in enumerate(chart.allergies):
                yield fhir_render.allergy_intolerance(sandbox_id("alg", key, n), patient_id, allergy)
        elif resource_type == "Encounter":
            for n, encounter in enumerate(chart.encounters()):
                yield fhir_render.encounter(sandbox_id("enc", key, n), patient_id, encounter)
        elif resource_type == "Observation":
            for n, encounter in enumerate(chart.encounters()):
                yield from fhir_render.observations(sandbox_id("obs", key, n), patient_id, sandbox_id("enc", key, n),
                                                         encounter)

