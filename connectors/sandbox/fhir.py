"""The sandbox EHR's FHIR side: `read_resource` and `search_resources` over the generator.

What exists: the clinic's synthetic patients (`patient_panel`), its physicians (users with an NPI)
as Practitioners (id = the user id) and PractitionerRoles, the clinic as an Organization and a
Location, the medication catalogue as Medications, their appointments over a bounded window
around today (`fetch_appointments`, as the EHR shows them today), and each patient's chart
(`fetch_chart`: Encounters, their vital signs as Observations, Conditions, MedicationRequests,
AllergyIntolerances) and the rest of their US Core record (`us_core_record`: Immunizations,
Procedures, Devices, Goals, lab DiagnosticReports with their ServiceRequests, Specimens and
DocumentReferences, FamilyMemberHistory, a RelatedPerson, Coverage, a CarePlan, a CareTeam, a
QuestionnaireResponse, a MedicationDispense per order, and a Provenance per record entry).
Every id is R4's type (`models.ids.sandbox_id`): a patient `pat-{hex}`, a Practitioner the user id
in R4's spelling (`usr-…`, `models.ids.fhir_id`), the clinic's Organization its id in R4's spelling,
a patient's resources `{kind}-{patient hex}-{n}` (an Observation adds `-{vital}`), so a read finds its
patient without a scan; ids are never reused across kinds. The FHIR API hands ids in already
normalised (an old `pat_…` spelling is read as `pat-…`: `fhir_api.search.resource_id`). Rendering to FHIR is
`connectors.sandbox.render`'s.
"""
from __future__ import annotations

import datetime as dt
import itertools
import re
from types import MappingProxyType

from connectors.sandbox import render
from connectors.base import PatientNotFound, Provider, ResourceNotFound, ResourceQuery
from connectors.matching import date_of, matches
from models.ids import fhir_id, sandbox_id

APPOINTMENT_PAST_DAYS = 30     # appointments the FHIR API shows: from today - 30 days ...
APPOINTMENT_FUTURE_DAYS = 90   # ... to today + 90 days
CHART_KINDS = (("Encounter", "enc"), ("Condition", "cnd"), ("Observation", "obs"),
               ("MedicationRequest", "med"), ("AllergyIntolerance", "alg"), ("Immunization", "imm"),
               ("Procedure", "prc"), ("Device", "dev"), ("Goal", "gol"), ("DiagnosticReport", "drp"),
               ("ServiceRequest", "srq"), ("Specimen", "spc"), ("DocumentReference", "doc"),
               ("FamilyMemberHistory", "fmh"), ("RelatedPerson", "rel"), ("Coverage", "cov"), ("CarePlan", "cpl"),
               ("CareTeam", "ctm"), ("QuestionnaireResponse", "qre"), ("MedicationDispense", "mdd"),
               ("Provenance", "prv"))
"""The types of a patient's record, each with the prefix of its ids."""
_KINDS = MappingProxyType(dict(CHART_KINDS))
RECORD_KINDS = frozenset(kind for kind, _ in CHART_KINDS[5:])
"""The record types beyond the chart's (`SandboxFhir._us_core`)."""
_CHART_ID = re.compile(r"^(%s)-([0-9a-f]{16})-(\d{1,4})(?:-(%s))?$" % ("|".join(_KINDS.values()),
                                                                    "|".join(render.VITAL_SUFFIXES)))
PROVENANCE_OF = ("Condition", "AllergyIntolerance", "MedicationRequest", "Immunization", "Procedure")
"""The record entries each with a Provenance (in this order)."""
DIRECTORY = ("Organization", "Location", "Medication", "PractitionerRole")
"""The clinic's resources outside any patient's compartment (besides Practitioner)."""
PATIENT_PREFIX = sandbox_id("pat", "")
"""`pat-`: a sandbox patient id is this and 16 hex digits."""


def patient_key(patient_id: str) -> str:
    """The hex of a sandbox patient id (`pat-{hex}`; the first release's `pat_{hex}` too)."""
    return patient_id[len(PATIENT_PREFIX):]


class SandboxFhir:
    """Mixed into `SandboxConnector` (which has `organization_id`, `organization_name`, `now()`,
    `_call()`, `physicians()`, `medication_catalogue()`, `fetch_appointments`, `fetch_chart` (=
    `chart_of(chart_patient(id))`), `us_core_record` and `rendered`)."""

    answers_matched = True
    """`search_resources` yields what `connectors.matching.matches` accepts for the query (`_matches`)."""
    reads_on_loop = False
    """A read is generated in memory: nothing to wait for."""

    rendered = None
    """The process's `RenderedResources` (`connectors.sandbox.rendered`), or None: render every time."""

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
        elif resource_type in DIRECTORY:
            found = next((r for r in self._directory(resource_type) if r["id"] == resource_id), None)
        elif _KINDS.get(resource_type):
            match = _CHART_ID.fullmatch(resource_id)
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
        elif kind == "Appointment":  # narrowed to the `date` asked (the matcher checks it again)
            start, end = query.start, query.end
            for (low, high) in (c.values[0] for c in query.criteria if c.name == "date"):
                start = low if start is None or (low is not None and low > start) else start
                end = high if end is None or (high is not None and high < end) else end
            found = self._appointments(query.practitioner, query.patient, start, end)
        elif kind in DIRECTORY:
            found = iter(self._directory(kind))
        elif kind == "Provenance" and not query.patient and any(c.name == "target" for c in query.criteria):
            targets = [t for c in query.criteria if c.name == "target" for t in c.values]  # their patients' only
            keys = {m.group(2) for _, ident in targets for m in (_CHART_ID.fullmatch(ident or ""),) if m}
            keys |= {ident[len(PATIENT_PREFIX):] for kind_, ident in targets if kind_ == "Patient"}
            found = (r for key in sorted(keys) for r in self._chart_resources(kind, PATIENT_PREFIX + key))
        elif _KINDS.get(kind):
            named = [ident for c in query.criteria if c.name == "patient" and c.kind == "reference"
                     for of, ident in c.values if of == "Patient"]  # `patient=A,B`: theirs only
            patients = (query.patient,) if query.patient else named or [p.id for p in self.panel()]
            found = (r for pid in patients for r in self._chart_resources(kind, pid))
        else:
            return iter(())
        return (r for r in found if matches(r, query))

    # -- resources ---------------------------------------------------------------------------
    def _patients(self, wanted):
        system = f"urn:svc-auth:sandbox:{self.organization_id}:patient"
        return (render.patient(p, system) for p in self.panel() if wanted is None or p.id in wanted)

    def _practitioners(self):
        return [render.practitioner(fhir_id(u.id), u.given_name, u.family_name, u.npi) for u in self.physicians()]

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
                    found.append(render.appointment(appointment, fhir_id(user.id), f"Dr. {user.display_name}"))
        found.sort(key=lambda r: (r["start"], r["id"]))
        return iter(found)

    def _chart_resources(self, resource_type: str, patient_id: str):
        """The patient's resources of `resource_type`: the EHR is called for the chart (and the call
        recorded) every time; the chart's generation and rendering are kept per process when the
        connector has a `rendered` memory (`connectors.sandbox.rendered`, keyed on today's date too)."""
        try:
            patient = self.chart_patient(patient_id)
        except PatientNotFound:
            return
        if self.rendered is None:
            yield from self._render_chart(resource_type, patient_id, self.chart_of(patient))
            return
        key = (self.organization_id, self.organization_name, patient_id, resource_type, self.now().date())
        yield from self.rendered.get(key, lambda: self._render_chart(resource_type, patient_id, self.chart_of(patient)))

    def _render_chart(self, resource_type: str, patient_id: str, chart):
        key = patient_key(patient_id)
        if resource_type in RECORD_KINDS:
            yield from self._us_core(resource_type, key, patient_id, chart)
        elif resource_type == "Condition":
            for n, problem in enumerate(chart.problems):
                yield render.condition(sandbox_id("cnd", key, n), patient_id, problem)
        elif resource_type == "MedicationRequest":
            for n, medication in enumerate(chart.medications):
                yield render.medication_request(sandbox_id("med", key, n), patient_id, medication,
                                                     self._medication_id(medication["name"]))
        elif resource_type == "AllergyIntolerance":
            for n, allergy in enumerate(chart.allergies):
                yield render.allergy_intolerance(sandbox_id("alg", key, n), patient_id, allergy)
        elif resource_type == "Encounter":
            for n, encounter in enumerate(chart.encounters()):
                yield render.encounter(sandbox_id("enc", key, n), patient_id, encounter,
                                       f"urn:svc-auth:sandbox:{self.organization_id}:encounter", self._location_id())
        elif resource_type == "Observation":
            for n, encounter in enumerate(chart.encounters()):
                yield from render.observations(sandbox_id("obs", key, n), patient_id, sandbox_id("enc", key, n),
                                                         encounter)


    # -- the clinic's directory --------------------------------------------------------------
    def _location_id(self) -> str:
        return sandbox_id("loc", self.organization_id.rpartition('_')[2])

    def _medication_id(self, name: str) -> str:
        return sandbox_id("mdc", [entry[0] for entry in self.medication_catalogue()].index(name))

    def _directory(self, resource_type: str) -> list[dict]:
        org, location = fhir_id(self.organization_id), self._location_id()
        if resource_type == "Organization":
            return [render.organization(org, self.organization_name)]
        if resource_type == "Location":
            return [render.location(location, org, f"{self.organization_name} clinic")]
        if resource_type == "Medication":
            return [render.medication(self._medication_id(name), name, dose)
                    for name, dose, _ in self.medication_catalogue()]
        return [render.practitioner_role(sandbox_id("rol", u.id.rpartition('_')[2]), fhir_id(u.id), org, location)
                for u in self.physicians()]

    # -- the rest of a patient's US Core record ----------------------------------------------------
    def _us_core(self, kind: str, key: str, patient_id: str, chart) -> list[dict]:
        """The patient's resources of `kind` from `us_core_record` (ids `{prefix}-{key}-{n}`)."""
        record, org = self.us_core_record(patient_id), fhir_id(self.organization_id)
        prefix = _KINDS[kind]

        def ident(n: int, of: str = prefix) -> str:
            return sandbox_id(of, key, n)
        if kind == "Immunization":
            return [render.immunization(ident(n), patient_id, *item) for n, item in enumerate(record["immunizations"])]
        if kind == "Procedure":
            return [render.procedure(ident(n), patient_id, *item) for n, item in enumerate(record["procedures"])]
        if kind == "Device":
            return [render.device(ident(n), patient_id, *item) for n, item in enumerate(record["devices"])]
        if kind == "Goal":
            return [render.goal(ident(n), patient_id, *item) for n, item in enumerate(record["goals"])]
        if kind == "ServiceRequest":
            return [render.service_request(ident(n), patient_id, *item) for n, item in enumerate(record["reports"])]
        if kind == "Specimen":
            return [render.specimen(ident(n), patient_id, ident(n, "srq"), day)
                    for n, (_, _, day) in enumerate(record["reports"])]
        if kind == "DiagnosticReport":
            return [render.diagnostic_report(ident(n), patient_id, org, code, text, day, ident(n, "srq"), ident(n, "spc"))
                    for n, (code, text, day) in enumerate(record["reports"])]
        if kind == "DocumentReference":
            return [render.document_reference(ident(n), patient_id, org, text, day)
                    for n, (_, text, day) in enumerate(record["reports"])]
        if kind == "FamilyMemberHistory":
            return [render.family_member_history(ident(n), patient_id, *item) for n, item in enumerate(record["family"])]
        if kind == "RelatedPerson":
            return [render.related_person(ident(0), patient_id, *record["related"])]
        if kind == "Coverage":
            return [render.coverage(ident(0), patient_id, *record["coverage"])]
        if kind == "CarePlan":
            return [render.care_plan(ident(0), patient_id, *record["care_plan"])]
        if kind == "CareTeam":  # with the clinic's first physician, in their role, and the related person
            doctor = next(iter(self.physicians()), None)
            return [render.care_team(ident(0), patient_id, org, fhir_id(doctor.id) if doctor else None,
                                     sandbox_id("rol", doctor.id.rpartition('_')[2]) if doctor else None,
                                     ident(0, _KINDS["RelatedPerson"]))]
        if kind == "QuestionnaireResponse":
            return [render.questionnaire_response(ident(0), patient_id, *record["questionnaire"])]
        if kind == "MedicationDispense":
            return [render.medication_dispense(ident(n), patient_id, self._medication_id(m["name"]), ident(n, "med"),
                                                    m.get("started")) for n, m in enumerate(chart.medications)]
        targets = [r for of in PROVENANCE_OF for r in self._chart_resources(of, patient_id)]  # Provenance
        return [render.provenance(ident(n), patient_id, target, org, (date_of(target) or "2016-01-04")[:10])
                for n, target in enumerate(targets)]
