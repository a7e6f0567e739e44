"""The sandbox EHR's generator: deterministic, realistic, de-identified data generated per organization.

Every value derives from a hash of (organization id, what is asked), so the same question gives
the same answer on every machine and run, and nothing is stored. All people are synthetic.

The schedule lives: every appointment has a date it was booked on (most weeks ahead, a share only
days ahead) and some are cancelled on a later date, both derived from the appointment. Asked on
date D, the EHR shows the appointments booked before D and not cancelled before D, so from one day
to the next new bookings appear and cancelled appointments disappear, deterministically from the
date. `fetch_appointments` answers as of its `start` (the nightly sync reads at the start of its
window), or as of `as_of` when given.

For testing error handling, the organization's `ehr_url` can ask the sandbox to misbehave:
`?outage=1` makes every call fail as unavailable (retried), `?latency=SECONDS` delays every call.
`?panel=N` gives the clinic N patients instead of `PANEL_SIZE` (at most `MAX_PANEL_SIZE`; the first
150 are the same either way): the Bulk Data benchmark's 10,000-patient clinic (bench/bulk_export.py).
"""
from __future__ import annotations

import datetime as dt
import hashlib
import random
import time
from functools import lru_cache
from types import MappingProxyType
from urllib.parse import parse_qs, urlsplit

from connectors.base import (Appointment, Chart, ConnectorError, ConnectorUnavailable, Encounter, Patient, PatientNotFound,
                             Provider)
from connectors.sandbox import render
from connectors.fhir.spool import observation_of
from connectors.sandbox.fhir import SandboxFhir, patient_key
from connectors.sandbox.rendered import RenderedResources
from models.directory import User
from models.ids import fhir_id, sandbox_id

PANEL_SIZE = 150
MAX_PANEL_SIZE = 100_000
SLOT_MINUTES = 30
DAY_START_UTC = dt.time(13, 0)   # 09:00 US Eastern
DAY_END_UTC = dt.time(21, 0)
HISTORY_START = dt.date(2016, 1, 4)
RECENT_BOOKING_SHARE = 0.4   # appointments booked at most RECENT_BOOKING_DAYS ahead (seen late)
RECENT_BOOKING_DAYS = 10
CANCELLATION_SHARE = 0.1     # appointments cancelled some day between their booking and the visit

FIRST_F = ("Avery", "Brooke", "Camila", "Dana", "Elena", "Fiona", "Grace", "Hana", "Iris", "Jade", "Kira",
           "Lena", "Maya", "Nora", "Olive", "Paige", "Quinn", "Rosa", "Sage", "Tara", "Uma", "Vera", "Willa", "Zoe")
FIRST_M = ("Aaron", "Blake", "Caleb", "Dario", "Eli", "Felix", "Gabe", "Hugo", "Ivan", "Jonah", "Kai", "Leo",
           "Milo", "Nico", "Omar", "Pablo", "Reid", "Soren", "Theo", "Ulises", "Victor", "Wes", "Yusuf", "Zane")
LAST = ("Abbott", "Barrow", "Castillo", "Delgado", "Ellison", "Fairbanks", "Gallagher", "Hartley", "Ibarra",
        "Jennings", "Kowalski", "Lindqvist", "Mercado", "Nakamura", "Okafor", "Prescott", "Quintero", "Rasmussen",
        "Sandoval", "Thibodeaux", "Underwood", "Valencia", "Whitfield", "Yamamoto", "Zielinski")
PROBLEMS = (("I10", "Essential (primary) hypertension"), ("E11.9", "Type 2 diabetes mellitus without complications"),
            ("E78.5", "Hyperlipidemia, unspecified"), ("J45.909", "Unspecified asthma, uncomplicated"),
            ("M54.50", "Low back pain, unspecified"), ("F41.1", "Generalized anxiety disorder"),
            ("K21.9", "Gastro-esophageal reflux disease without esophagitis"), ("E03.9", "Hypothyroidism, unspecified"),
            ("G43.909", "Migraine, unspecified"), ("M17.11", "Unilateral primary osteoarthritis, right knee"),
            ("E66.9", "Obesity, unspecified"), ("N39.0", "Urinary tract infection, site not specified"))
MEDICATIONS = (("Lisinopril", "10 mg", "once daily"), ("Metformin", "500 mg", "twice daily with meals"),
               ("Atorvastatin", "20 mg", "once daily at bedtime"), ("Albuterol HFA", "90 mcg/actuation", "2 puffs every 4-6 h as needed"),
               ("Levothyroxine", "50 mcg", "once daily before breakfast"), ("Omeprazole", "20 mg", "once daily"),
               ("Sertraline", "50 mg", "once daily"), ("Amlodipine", "5 mg", "once daily"),
               ("Ibuprofen", "400 mg", "every 8 h as needed"), ("Sumatriptan", "50 mg", "at migraine onset, max 200 mg/day"))
ALLERGIES = (("Penicillin", "Hives", "moderate"), ("Sulfonamides", "Rash", "mild"), ("Peanuts", "Anaphylaxis", "severe"),
             ("Latex", "Contact dermatitis", "mild"), ("Shellfish", "Swelling of lips", "moderate"))
VISIT_TYPES = (("Follow-up", 30), ("Annual physical", 30), ("New patient", 60), ("Telehealth", 30),
               ("Acute visit", 30), ("Medication review", 30))
REASONS = ("Blood pressure check", "Diabetes follow-up", "Annual wellness exam", "Cough and congestion",
           "Medication refill", "Back pain", "Lab results review", "Headaches", "Knee pain", "Anxiety follow-up",
           "Thyroid follow-up", "Heartburn")
ASSESSMENTS = ("Condition stable on current regimen.", "Symptoms improved since last visit.",
               "Mild exacerbation; no red flags on exam.", "Labs within target range.",
               "Patient reports good adherence and no side effects.", "Findings consistent with a viral illness.")
PLANS = ("Continue current medications; follow up in 3 months.", "Order basic metabolic panel and HbA1c.",
         "Start home exercise program; recheck in 6 weeks.", "Increase dose as tolerated; call with side effects.",
         "Supportive care, fluids and rest; return if worse.", "Refer to physical therapy.")

# US Core data beyond the chart (`SandboxConnector.us_core_record`): (code, display) in each system.
IMMUNIZATIONS = (("140", "Influenza, seasonal, injectable, preservative free"), ("208", "COVID-19, mRNA, LNP-S, PF, 30 mcg/0.3 mL dose"),
                 ("113", "Td (adult), 5 Lf tetanus toxoid, preservative free, adsorbed"), ("33", "pneumococcal polysaccharide vaccine, 23 valent"),
                 ("43", "hepatitis B vaccine, adult dosage"))
PROCEDURES = (("73761001", "Colonoscopy"), ("80146002", "Excision of appendix"), ("71651007", "Mammography"),
              ("399208008", "Plain chest X-ray"), ("29303009", "Electrocardiographic procedure"))
DEVICES = (("14106009", "Cardiac pacemaker, device"), ("468063009", "Coated femoral hip prosthesis"))
GOALS = ("Hemoglobin A1c below 7%", "Blood pressure below 130/80", "Walk 30 minutes five days a week", "Lose 5% of body weight")
LAB_PANELS = (("24323-8", "Comprehensive metabolic 2000 panel - Serum or Plasma"), ("58410-2", "CBC panel - Blood by Automated count"),
              ("57698-3", "Lipid panel with direct LDL - Serum or Plasma"), ("4548-4", "Hemoglobin A1c/Hemoglobin.total in Blood"))
RELATIVES = (("MTH", "mother"), ("FTH", "father"), ("SIS", "sister"), ("BRO", "brother"))
FAMILY_CONDITIONS = (("38341003", "Hypertensive disorder"), ("44054006", "Diabetes mellitus type 2"),
                     ("22298006", "Myocardial infarction"), ("254837009", "Malignant neoplasm of breast"))
PAYERS = ("Acme Health Plan", "Blue Meadow Insurance", "Medicare Part B", "Sunrise Medicaid")


def _rng(*parts) -> random.Random:
    seed = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return random.Random(int.from_bytes(seed[:8], "big"))


def _hex(*parts, length: int = 16) -> str:
    return hashlib.sha256(":".join(str(p) for p in parts).encode()).hexdigest()[:length]


@lru_cache(maxsize=64)
def patient_panel(organization_id: str, size: int = PANEL_SIZE) -> tuple[Patient, ...]:
    """The organization's synthetic patients, always the same ones (`size` of them)."""
    patients = []
    for index in range(size):
        rng = _rng(organization_id, "patient", index)
        sex = rng.choice(["female", "male"])
        first = rng.choice(FIRST_F if sex == "female" else FIRST_M)
        born = dt.date(1940, 1, 1) + dt.timedelta(days=rng.randrange(0, 365 * 80))
        patients.append(Patient(id=sandbox_id("pat", _hex(organization_id, "patient", index)), first_name=first,
                                last_name=rng.choice(LAST), date_of_birth=born, sex=sex))
    return tuple(patients)


@lru_cache(maxsize=16)
def _panel_index(organization_id: str, size: int) -> MappingProxyType:
    """The panel by patient id (a chart's lookup is one probe, whatever the panel's size)."""
    return MappingProxyType({p.id: p for p in patient_panel(organization_id, size)})


class SandboxConnector(SandboxFhir):
    """The sandbox EHR of one organization; `clock`: the runtime's (what "today" is for the FHIR API)."""

    def __init__(self, organization_id: str, organization_name: str, ehr_url: str = "", clock=None, rendered=None):
        self.organization_id = organization_id
        self.rendered = rendered  # the process's memory of rendered resources (`connectors.sandbox.rendered`)
        self.organization_name = organization_name
        self.clock = clock
        query = parse_qs(urlsplit(ehr_url).query) if "?" in (ehr_url or "") else {}  # built per request: parse only a query
        self.outage = query.get("outage", ["0"])[0] not in ("", "0")
        try:
            self.latency = max(0.0, float(query.get("latency", ["0"])[0]))
        except ValueError:
            self.latency = 0.0
        try:
            self.panel_size = min(MAX_PANEL_SIZE, max(1, int(query.get("panel", [PANEL_SIZE])[0])))
        except ValueError:
            self.panel_size = PANEL_SIZE

    def _call(self) -> None:
        """Where a real connector talks to its EHR: simulate its latency and outages."""
        if self.latency:
            time.sleep(self.latency)
        if self.outage:
            raise ConnectorUnavailable("The sandbox EHR is unavailable (simulated outage).")

    def now(self) -> dt.datetime:
        """Naive UTC now, from the runtime's clock when there is one."""
        return self.clock.now() if self.clock is not None else dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)

    def panel(self) -> tuple[Patient, ...]:
        return patient_panel(self.organization_id, self.panel_size)

    def medication_catalogue(self) -> tuple:
        """The medications the clinic prescribes: (name, dose, frequency)."""
        return MEDICATIONS

    def physicians(self) -> list:
        """The organization's physicians (users with an NPI), by id: the EHR's practitioners."""
        return list(User.select().where((User.organization == self.organization_id) & User.npi.is_null(False)
                                        & (User.npi != "")).order_by(User.id))

    def user_practitioner(self, provider: Provider) -> str | None:
        """The sandbox's Practitioner of a user: the user itself when it has an NPI (`physicians`)."""
        return fhir_id(provider.user_id) if provider.npi else None

    recorder = None
    """`connectors.connector_for`'s recorder: called once per connector call (the disclosure audit's `ehr.fetch`)."""

    def _recorded_call(self, resource_type: str, query: str, patients=()) -> None:
        """`_call()`, its failure recorded; a success is recorded by the caller once it knows the patients."""
        try:
            self._call()
        except ConnectorError:
            if self.recorder is not None:
                self.recorder("failure", resource_type, (), patients, query)
            raise

    def fetch_appointments(self, provider: Provider, start: dt.datetime, end: dt.datetime,
                           as_of: dt.datetime | None = None):
        """The provider's appointments in [start, end) as the EHR shows them at `as_of` (default `start`)."""
        query = f"practitioner={provider.npi}&start={start.isoformat()}&end={end.isoformat()}"
        self._recorded_call("Appointment", query)
        found = list(self._provider_appointments(provider, start, end, as_of))
        if self.recorder is not None:
            self.recorder("success", "Appointment", [a.id for a in found], [a.patient.id for a in found], query)
        yield from found

    def _provider_appointments(self, provider: Provider, start: dt.datetime, end: dt.datetime, as_of: dt.datetime | None):
        panel = self.panel()
        today = (as_of or start).date()
        day = start.date()
        while day <= end.date():
            if day.weekday() < 5:  # clinics are closed at weekends
                for appointment in self._day(provider, day, panel, start, end):
                    booked_on, cancelled_on = self.booking(provider, appointment.start)
                    if booked_on < today and (cancelled_on is None or cancelled_on >= today):
                        yield appointment
            day += dt.timedelta(days=1)

    def booking(self, provider: Provider, slot: dt.datetime) -> tuple[dt.date, dt.date | None]:
        """(booked on, cancelled on or None) of the appointment of `provider` at `slot`."""
        rng = _rng(self.organization_id, provider.npi, slot.isoformat(), "booking")
        recent = rng.random() < RECENT_BOOKING_SHARE
        lead = rng.randint(1, RECENT_BOOKING_DAYS) if recent else rng.randint(RECENT_BOOKING_DAYS + 1, 120)
        booked_on = slot.date() - dt.timedelta(days=lead)
        cancelled_on = None
        if rng.random() < CANCELLATION_SHARE:
            cancelled_on = booked_on + dt.timedelta(days=rng.randint(1, lead))
        return booked_on, cancelled_on

    def _day(self, provider: Provider, day: dt.date, panel, start: dt.datetime, end: dt.datetime):
        rng = _rng(self.organization_id, provider.npi, day.isoformat())
        slot = dt.datetime.combine(day, DAY_START_UTC)
        close = dt.datetime.combine(day, DAY_END_UTC)
        room = rng.randrange(1, 7)
        while slot < close:
            if rng.random() < 0.72:
                visit_type, minutes = rng.choice(VISIT_TYPES)
                appointment_end = min(slot + dt.timedelta(minutes=minutes), close)
                patient = panel[rng.randrange(len(panel))]
                rng.randrange(3)  # the draw of a status the sandbox no longer varies (keeps every later draw)
                status = "booked"  # FHIR: confirmed to go ahead; cancelled ones disappear (booking())
                if start <= slot < end:
                    yield Appointment(
                        id=sandbox_id("apt", _hex(self.organization_id, provider.npi, slot.isoformat())),
                        start=slot, end=appointment_end, status=status, appointment_type=visit_type,
                        reason=rng.choice(REASONS),
                        location="Telehealth" if visit_type == "Telehealth" else f"Exam Room {room}",
                        patient=patient)
                slot = appointment_end
            else:
                slot += dt.timedelta(minutes=SLOT_MINUTES)

    def fetch_chart(self, patient_id: str) -> Chart:
        return self.chart_of(self.chart_patient(patient_id))

    def chart_patient(self, patient_id: str) -> Patient:
        """The EHR's call for a patient's chart (recorded, as `fetch_chart`'s): the patient, or
        PatientNotFound."""
        patient_id = fhir_id(patient_id)  # a chart request made before issue 35 names `pat_…`
        self._recorded_call("Patient", "chart", (patient_id,))
        patient = _panel_index(self.organization_id, self.panel_size).get(patient_id)
        if patient is None:
            if self.recorder is not None:
                self.recorder("failure", "Patient", (patient_id,), (patient_id,), "chart")
            raise PatientNotFound(f"The EHR has no patient {patient_id} in this organization.")
        if self.recorder is not None:
            self.recorder("success", "Patient", (patient_id,), (patient_id,), "chart")
        return patient

    def chart_of(self, patient: Patient) -> Chart:
        """The chart of a patient `chart_patient` found (generated: no further call)."""
        patient_id = patient.id
        key = patient_key(patient_id)
        rng = _rng(self.organization_id, _seed(key), "chart")
        problems = [{"id": sandbox_id("cnd", key, n), "code": code, "description": text, "onset": _date(rng).isoformat()}
                    for n, (code, text) in enumerate(rng.sample(PROBLEMS, rng.randint(1, 5)))]
        medications = [{"id": sandbox_id("med", key, n), "name": name, "dose": dose, "frequency": freq,
                        "started": _date(rng).isoformat(), "status": "active"}
                       for n, (name, dose, freq) in enumerate(rng.sample(MEDICATIONS, rng.randint(0, 5)))]
        if not medications:  # every patient has an order (US Core's MedicationRequest, Medication and
            # MedicationDispense reachable from each), drawn apart so the other draws stay as they were
            extra = _rng(self.organization_id, _seed(key), "chart-medication")
            name, dose, freq = extra.choice(MEDICATIONS)
            medications = [{"id": sandbox_id("med", key, 0), "name": name, "dose": dose, "frequency": freq,
                            "started": _date(extra).isoformat(), "status": "active"}]
        allergies = [{"id": sandbox_id("alg", key, n), "substance": s, "reaction": r, "severity": sev}
                     for n, (s, r, sev) in enumerate(rng.sample(ALLERGIES, rng.randint(0, 2)))]
        count = rng.randint(3, 40)
        return Chart(patient=patient, organization_name=self.organization_name, problems=problems,
                     medications=medications, allergies=allergies,
                     encounter_source=lambda: self._encounters(patient_id, count),
                     observation_source=lambda: self._vital_signs(patient_id, count))

    def us_core_record(self, patient_id: str) -> dict:
        """The patient's US Core data beyond the chart, as plain values by kind, from its own draws
        (the chart's are unchanged): immunizations, procedures, devices, goals, lab reports (each
        with its order, specimen and note), family history, a related person, coverage, a care
        plan, a questionnaire; rendered by `connectors.sandbox.render`. Every patient has at least a
        device (and, in the chart, an order), so each US Core type is reachable from any patient."""
        rng = _rng(self.organization_id, patient_id, "us-core")
        record = {
            "immunizations": [(code, text, _date(rng).isoformat()) for code, text in rng.sample(IMMUNIZATIONS, rng.randint(1, 3))],
            "procedures": [(code, text, _date(rng).isoformat()) for code, text in rng.sample(PROCEDURES, rng.randint(0, 2))],
            "devices": [rng.choice(DEVICES)] if rng.random() < 0.3 else [],
            "goals": [(text, (_date(rng) + dt.timedelta(days=3000)).isoformat()) for text in rng.sample(GOALS, rng.randint(1, 2))],
            "reports": [(code, text, _date(rng).isoformat()) for code, text in rng.sample(LAB_PANELS, rng.randint(1, 2))],
            "family": [(rng.choice(RELATIVES), rng.choice(FAMILY_CONDITIONS)) for _ in range(rng.randint(1, 2))],
            "related": (rng.choice(RELATIVES), rng.choice(FIRST_F + FIRST_M), rng.choice(LAST)),
            "coverage": (rng.choice(PAYERS), f"{rng.randrange(10**8, 10**9)}", _date(rng).isoformat()),
            "care_plan": (rng.choice(PLANS), _date(rng).isoformat()),
            "questionnaire": ([rng.randint(0, 3) for _ in range(2)], _date(rng).isoformat()),
        }
        if not record["devices"]:  # every patient has a device (US Core's Device), drawn apart
            record["devices"] = [_rng(self.organization_id, patient_id, "us-core-device").choice(DEVICES)]
        return record

    def _encounters(self, patient_id: str, count: int):
        """The patient's visits, ids `enc-{key}-{n}` as the sandbox's FHIR API serves them; their
        `vitals` are generated here and charted as Observations (`_vital_signs`)."""
        key = patient_key(patient_id)
        rng = _rng(self.organization_id, _seed(key), "encounters")
        day = HISTORY_START + dt.timedelta(days=rng.randrange(0, 200))
        for n in range(count):
            visit_type, _minutes = rng.choice(VISIT_TYPES)
            yield Encounter(
                date=day, encounter_type=visit_type, provider=f"Dr. {rng.choice(FIRST_F + FIRST_M)} {rng.choice(LAST)}",
                reason=rng.choice(REASONS),
                vitals={"blood_pressure": f"{rng.randint(104, 152)}/{rng.randint(64, 96)} mmHg",
                        "heart_rate": f"{rng.randint(56, 98)} bpm", "temperature": f"{rng.uniform(36.3, 37.6):.1f} C",
                        "weight": f"{rng.uniform(48, 118):.1f} kg"},
                assessment=rng.choice(ASSESSMENTS), plan=rng.choice(PLANS), id=sandbox_id("enc", key, n))
            day += dt.timedelta(days=rng.randint(20, 120))

    def _vital_signs(self, patient_id: str, count: int):
        """The vital signs of every visit as chart observations: the FHIR Observations the
        sandbox's FHIR API serves, read as a FHIR EHR's are (`connectors.fhir.spool.observation_of`)."""
        key = patient_key(patient_id)
        for n, encounter in enumerate(self._encounters(patient_id, count)):
            for resource in render.observations(sandbox_id("obs", key, n), patient_id, sandbox_id("enc", key, n),
                                                     encounter):
                yield observation_of(resource)


def _seed(key: str) -> str:
    """What a patient's generated chart derives from: their id as first spelled (`pat_{key}`), so
    every chart stayed the same when ids took R4's spelling (issue 35)."""
    return f"pat_{key}"


def _date(rng: random.Random) -> dt.date:
    return HISTORY_START + dt.timedelta(days=rng.randrange(0, 3000))


def connect(runtime, organization, bounds=None) -> SandboxConnector:
    """The generator has no network to bound: `bounds` is not used. Rendered resources are kept per
    process (`connectors.sandbox.rendered`, held by the runtime)."""
    return SandboxConnector(organization.id, organization.name, organization.ehr_url, clock=runtime.clock,
                            rendered=runtime.connector_state("sandbox", RenderedResources))
