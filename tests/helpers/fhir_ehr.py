"""A real FHIR R4 EHR for the tests: tests/js/fhir_ehr.mjs (Medplum's FHIR engine behind
node-oidc-provider's SMART Backend Services tokens), started as a process on a free port (the
`fhir_ehr` fixture, conftest.py's), connecting a clinic to it, and the resources tests seed it with."""
from __future__ import annotations

import base64
import datetime as dt
import json
import subprocess
import sys
import urllib.request

from helpers.environment import JS_DIR, ROOT
from helpers.processes import free_port, settings_env

NPI_SYSTEM = "http://hl7.org/fhir/sid/us-npi"
CLIENT_ID = "svc-auth-at-the-test-ehr"


class FhirEhr:
    """The running EHR: its FHIR base, and the test controls under /admin."""

    def __init__(self, port: int, proc: subprocess.Popen, base: str | None = None):
        self.port, self.proc = port, proc
        self.origin = f"http://127.0.0.1:{port}"
        self.base = base or f"{self.origin}/fhir/R4"   # the vendor's (Epic: {origin}/api/FHIR/R4)

    def admin(self, path: str, body: dict | None = None) -> dict:
        request = urllib.request.Request(f"{self.origin}/admin/{path}", method="POST" if body is not None else "GET",
                                         data=json.dumps(body).encode() if body is not None else None)
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"{}")

    def seed(self, *resources: dict) -> None:
        self.admin("seed", {"resources": list(resources)})

    def register(self, client_id: str, jwks_uri: str, grant: list[str] | None = None) -> None:
        """Register svc-auth as a backend-services client whose keys are at `jwks_uri`; `grant`: the
        only types whose scopes its tokens get (default: every type the EHR serves)."""
        self.admin("client", {"client_id": client_id, "jwks_uri": jwks_uri, **({"grant": grant} if grant else {})})

    def statement(self, hide: list[str] = (), params: dict | None = None) -> None:
        """The EHR's CapabilityStatement leaves out the types `hide`, and lists only `params[type]`'s
        search parameters for those types."""
        self.admin("statement", {"hide": list(hide), "params": params or {}})

    def page_by(self, max_count: int) -> None:
        """The EHR's searches answer at most `max_count` matches a page, whatever `_count` asks."""
        self.admin("paging", {"max_count": max_count})

    def latency(self, ms: int) -> None:
        """Each FHIR request is answered `ms` later; `stats()` then has `maxInFlight` (most requests
        served at once since), `inFlight` and `idleMs` (how long none has been in flight)."""
        self.admin("latency", {"ms": ms})

    def revoke(self) -> None:
        self.admin("revoke", {})

    def fault(self, status: int, count: int, retry_after: float | None = None, text: str | None = None,
              code: str | None = None) -> None:
        """The next `count` FHIR requests answer `status` (with Retry-After when given) and an
        OperationOutcome of issue `code` whose text is `text` (`{request}` in it: the request's path
        and decoded query, as an EHR quotes a search it refuses)."""
        self.admin("fault", {"status": status, "count": count,
                             **({"retry_after": retry_after} if retry_after is not None else {}),
                             **({"text": text} if text is not None else {}), **({"code": code} if code else {})})

    def hostile(self, *appointments: dict) -> None:
        """Add these (unstorable) Appointments to the first page of every Appointment search."""
        self.admin("hostile", {"appointments": list(appointments)})

    def reshape(self, members: dict) -> None:
        """`{"Type/id": {member: value}}`: those members of that resource, in every answer that holds
        it (a read, a search's entries), replaced by values no FHIR server would store;
        `{"searchset/Type": {...}}`: those of every searchset Bundle of a search of that type."""
        self.admin("hostile", {"members": members})

    def stats(self) -> dict:
        return self.admin("stats")

    def offer_everything(self, offered: bool | str) -> None:
        """Whether the CapabilityStatement offers (and the server serves) Patient $everything;
        `"listed"`: offered in the CapabilityStatement, refused when called (400 not-supported)."""
        self.admin("capabilities", {"everything": offered})

    def bulk(self, **settings) -> dict:
        """Bulk Data export on this EHR (tests/js/bulk_export.mjs; off until `export=True`): change its
        switches (`export`, `polls`, `retry_after`, `patient` honour|refuse|ignore, `fail`
        status|manifest-error, `drip_ms`, `file_base`: the manifest's files under another base); returns `{"settings", "log"}` (each bulk request's
        method and path)."""
        return self.admin("bulk", settings) if settings else self.admin("bulk")

    def expire_tokens(self) -> None:
        """Every token used so far expires: the EHR answers 401 to it from now on."""
        self.admin("expire", {})

    def epic(self, **settings) -> dict:
        """Epic's GetProviderAppointments on this EHR (vendor epic; tests/js/epic_scheduling.mjs): change
        its settings (`user_id`, `time_zone`, `patient_system`, `provider_system`, `fhir_patient_ids`,
        `statuses` {appointment id: Epic status}, `durations` {appointment id: AppointmentDuration},
        `overrides` {appointment id: {member: value} shown instead},
        `error` + `error_status`: refuse every call; `restricted` [Patient id]: those patients' FHIR
        Patient.Read answers 403 with Epic's break-the-glass OperationOutcome); returns
        `{"settings", "calls"}` (the request bodies received)."""
        return self.admin("epic", settings) if settings else self.admin("epic")

    def compartment(self, patient_id: str) -> dict[str, list[str]]:
        """The ids the EHR holds in the patient's compartment, by type (Medplum's own search over
        its compartment definition; the test's ground truth)."""
        return self.admin(f"compartment/{patient_id}")


def cli(settings, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.__main__", *args], env=settings_env(settings), cwd=str(ROOT),
                          capture_output=True, text=True, timeout=180)


def connect_clinic(settings, ehr, jwks_uri: str, name: str = "FHIR Clinic", *flags: str) -> str:
    """The operator's steps: register svc-auth at the EHR, then create the clinic on `fhir`
    (`flags`: more of `orgs create`'s, e.g. `--fhir-profile oracle`)."""
    ehr.admin("reset", {})
    ehr.register(CLIENT_ID, jwks_uri)
    done = cli(settings, "orgs", "create", "--name", name, "--ehr", "fhir", "--fhir-base-url", ehr.base,
               "--fhir-client-id", CLIENT_ID, *flags, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["id"]


def start_fhir_ehr(*flags: str, token_ttl: int = 300) -> FhirEhr:
    """The test EHR; `flags` e.g. `--open`, or `--vendor oracle|epic|athena` (tests/js/vendors.mjs)."""
    port = free_port()
    node_modules = JS_DIR / "node_modules" / "@medplum" / "fhir-router"
    assert node_modules.exists(), "run `make test` (installs tests/js: Medplum's FHIR engine, oidc-provider)"
    proc = subprocess.Popen(["node", "fhir_ehr.mjs", "--port", str(port), *flags], cwd=JS_DIR,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={"PATH": "/usr/bin:/bin:/usr/local/bin", "EHR_TOKEN_TTL": str(token_ttl)})
    for line in proc.stdout:  # it prints "ready <base>" once it listens
        if line.startswith("ready "):
            break
    else:
        raise RuntimeError(f"the FHIR EHR did not start (exit {proc.wait()})")
    return FhirEhr(port, proc, line.split()[1])


def practitioner(pid: str, npi: str, family: str, given: str) -> dict:
    return {"resourceType": "Practitioner", "id": pid, "identifier": [{"system": NPI_SYSTEM, "value": npi}],
            "name": [{"family": family, "given": [given], "prefix": ["Dr."]}], "active": True}


def patient(pid: str, family: str, given: str, birth: str, gender: str) -> dict:
    return {"resourceType": "Patient", "id": pid,
            "meta": {"profile": ["http://hl7.org/fhir/us/core/StructureDefinition/us-core-patient"]},
            "identifier": [{"system": "http://hospital.example/mrn", "value": f"MRN-{pid}"}],
            "name": [{"family": family, "given": [given]}], "birthDate": birth, "gender": gender}


def appointment(aid: str, practitioner_id: str, patient_id: str, start, minutes: int = 30, status: str = "booked",
                kind: str = "Follow-up", reason: str = "Hypertension follow-up") -> dict:
    end = start + dt.timedelta(minutes=minutes)
    return {"resourceType": "Appointment", "id": aid, "status": status,
            "appointmentType": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/v2-0276",
                                            "code": "FOLLOWUP", "display": kind}]},
            "reasonCode": [{"text": reason}],
            "start": start.isoformat() + "Z", "end": end.isoformat() + "Z", "minutesDuration": minutes,
            "participant": [{"actor": {"reference": f"Practitioner/{practitioner_id}"}, "status": "accepted"},
                            {"actor": {"reference": f"Patient/{patient_id}"}, "status": "accepted"},
                            {"actor": {"reference": "Location/main", "display": "Main Street Clinic"},
                             "status": "accepted"}]}


SECRET_NOTE = "Document body: never copied into a chart"
VITALS = "http://terminology.hl7.org/CodeSystem/observation-category"


def chart_record(patient_id: str, encounters: int = 0, observations: int = 0, documents: int = 0) -> list[dict]:
    """A US Core-shaped record: two conditions, a medication request, an allergy, `encounters`
    encounters, a blood pressure and an HbA1c plus `observations` heart rates, `documents`
    discharge summaries (with content); and another patient with a condition and an observation."""
    ref = {"reference": f"Patient/{patient_id}"}
    day = dt.datetime(2024, 1, 1)
    return [
        {"resourceType": "Condition", "id": "cond-htn", "subject": ref, "onsetDateTime": "2019-04-02",
         "clinicalStatus": {"coding": [{"code": "active"}]},
         "code": {"coding": [{"system": "http://snomed.info/sct", "code": "38341003"}], "text": "Essential hypertension"}},
        {"resourceType": "Condition", "id": "cond-dm", "subject": ref, "onsetDateTime": "2021-09-15",
         "code": {"coding": [{"system": "http://snomed.info/sct", "code": "44054006", "display": "Type 2 diabetes"}]}},
        {"resourceType": "MedicationRequest", "id": "med-1", "status": "active", "intent": "order", "subject": ref,
         "authoredOn": "2021-09-20", "medicationCodeableConcept": {"text": "Metformin 500 mg tablet"},
         "dosageInstruction": [{"text": "twice daily with meals",
                                "doseAndRate": [{"doseQuantity": {"value": 500, "unit": "mg"}}]}]},
        {"resourceType": "AllergyIntolerance", "id": "alg-1", "patient": ref, "criticality": "high",
         "code": {"text": "Penicillin"}, "reaction": [{"manifestation": [{"text": "Hives"}], "severity": "moderate"}]},
        {"resourceType": "Patient", "id": "someone-else", "name": [{"family": "Else", "given": ["Some"]}],
         "birthDate": "1990-01-01", "gender": "other"},
        {"resourceType": "Condition", "id": "cond-other", "subject": {"reference": "Patient/someone-else"},
         "code": {"text": "Not this patient's"}},
        {"resourceType": "Observation", "id": "obs-other", "status": "final", "code": {"text": "Not this patient's"},
         "subject": {"reference": "Patient/someone-else"}, "valueQuantity": {"value": 1, "unit": "kg"}},
        *[{"resourceType": "Encounter", "id": f"enc-{n:03d}", "status": "finished", "subject": ref,
           "class": {"code": "AMB", "display": "ambulatory"}, "type": [{"text": "Office visit"}],
           "period": {"start": (day + dt.timedelta(days=n)).isoformat() + "Z"},
           "participant": [{"individual": {"reference": "Practitioner/pr-ana", "display": "Dr. Ana Lopez"}}],
           "reasonCode": [{"text": f"Visit {n}"}]} for n in range(encounters)],
        {"resourceType": "Observation", "id": "obs-bp", "status": "final", "subject": ref,
         "category": [{"coding": [{"system": VITALS, "code": "vital-signs", "display": "Vital Signs"}]}],
         "code": {"coding": [{"system": "http://loinc.org", "code": "85354-9", "display": "Blood pressure panel"}]},
         "effectiveDateTime": "2024-03-01T10:00:00Z",
         "component": [{"code": {"coding": [{"system": "http://loinc.org", "code": "8480-6"}], "text": "Systolic"},
                        "valueQuantity": {"value": 128, "unit": "mm[Hg]"}},
                       {"code": {"coding": [{"system": "http://loinc.org", "code": "8462-4"}], "text": "Diastolic"},
                        "valueQuantity": {"value": 82, "unit": "mm[Hg]"}}]},
        {"resourceType": "Observation", "id": "obs-a1c", "status": "final", "subject": ref,
         "category": [{"coding": [{"system": VITALS, "code": "laboratory", "display": "Laboratory"}]}],
         "code": {"coding": [{"system": "http://loinc.org", "code": "4548-4"}], "text": "Hemoglobin A1c"},
         "effectiveDateTime": "2024-03-02", "valueQuantity": {"value": 7.1, "unit": "%"},
         "interpretation": [{"coding": [{"code": "H", "display": "High"}]}]},
        *[{"resourceType": "Observation", "id": f"obs-{n:04d}", "status": "final", "subject": ref,
           "category": [{"coding": [{"system": VITALS, "code": "vital-signs", "display": "Vital Signs"}]}],
           "code": {"coding": [{"system": "http://loinc.org", "code": "8867-4", "display": "Heart rate"}]},
           "effectiveDateTime": (day + dt.timedelta(hours=n)).isoformat() + "Z",
           "valueQuantity": {"value": 60 + n % 40, "unit": "/min"}} for n in range(observations)],
        *[{"resourceType": "DocumentReference", "id": f"doc-{n}", "status": "current", "subject": ref,
           "date": (dt.datetime(2024, 2, 1) + dt.timedelta(days=n)).isoformat() + "Z",
           "type": {"coding": [{"system": "http://loinc.org", "code": "18842-5", "display": "Discharge summary"}]},
           "category": [{"coding": [{"code": "clinical-note", "display": "Clinical Note"}]}],
           "content": [{"attachment": {"contentType": "text/plain", "title": f"Discharge summary {n}",
                                       "data": base64.b64encode(SECRET_NOTE.encode()).decode()}}]}
          for n in range(documents)]]
