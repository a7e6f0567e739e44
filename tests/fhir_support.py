"""A real FHIR R4 EHR for the tests: tests/js/fhir_ehr.mjs (Medplum's FHIR engine behind
node-oidc-provider's SMART Backend Services tokens), started as a process on a free port."""
from __future__ import annotations

import datetime as dt
import json
import subprocess
import urllib.request
from pathlib import Path

import pytest

from conftest import free_port

JS_DIR = Path(__file__).resolve().parent / "js"
NPI_SYSTEM = "http://hl7.org/fhir/sid/us-npi"


class FhirEhr:
    """The running EHR: its FHIR base, and the test controls under /admin."""

    def __init__(self, port: int, proc: subprocess.Popen):
        self.port, self.proc = port, proc
        self.origin = f"http://127.0.0.1:{port}"
        self.base = f"{self.origin}/fhir/R4"

    def admin(self, path: str, body: dict | None = None) -> dict:
        request = urllib.request.Request(f"{self.origin}/admin/{path}", method="POST" if body is not None else "GET",
                                         data=json.dumps(body).encode() if body is not None else None)
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"{}")

    def seed(self, *resources: dict) -> None:
        self.admin("seed", {"resources": list(resources)})

    def register(self, client_id: str, jwks_uri: str) -> None:
        """Register svc-auth as a backend-services client whose keys are at `jwks_uri`."""
        self.admin("client", {"client_id": client_id, "jwks_uri": jwks_uri})

    def revoke(self) -> None:
        self.admin("revoke", {})

    def fault(self, status: int, count: int, retry_after: float | None = None) -> None:
        """The next `count` FHIR requests answer `status` (with Retry-After when given)."""
        self.admin("fault", {"status": status, "count": count,
                             **({"retry_after": retry_after} if retry_after is not None else {})})

    def stats(self) -> dict:
        return self.admin("stats")


def start_fhir_ehr(*flags: str, token_ttl: int = 300) -> FhirEhr:
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
    return FhirEhr(port, proc)


@pytest.fixture(scope="module")
def fhir_ehr():
    ehr = start_fhir_ehr()
    yield ehr
    ehr.proc.terminate()
    ehr.proc.wait(timeout=10)


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
