"""A night of FHIR clinics: 100 organizations x 20 physicians on the test FHIR EHR.

The EHR is `tests/js/fhir_ehr.mjs` (Medplum's FHIR engine in memory behind node-oidc-provider's
SMART Backend Services tokens), seeded with a practitioner per physician and their appointments
over the 10 days. A scratch PostgreSQL database gets the fleet (bench.fleet) on `ehr: fhir`, every
physician authorized and in session; a `svc-auth serve` publishes `/ehr/jwks.json` for the EHR.
One `svc-auth snapshot run` builds the night. Reported: appointments per second, and the share
of the night's wall time the EHR spent answering (its own busy time, measured inside it).
"""
from __future__ import annotations

import datetime as dt
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from bench.fleet import copy_rows, scratch_database, seed_fleet
from bench.service import BenchService
from models.npi import NPI_SYSTEM

ROOT = Path(__file__).resolve().parent.parent
JS_DIR = ROOT / "tests" / "js"
ORGANIZATIONS = 100
PHYSICIANS = 20
APPOINTMENTS_PER_PHYSICIAN = 12
PATIENTS = 500
CLIENT_ID = "svc-auth-bench"
NIGHT = dt.date(2026, 3, 2)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read() or b"{}")


def fhir_night_benchmark(postgres_url: str, say) -> dict:
    if not (JS_DIR / "node_modules" / "@medplum" / "fhir-router").exists():
        return {"skipped": "tests/js is not installed (make test installs Medplum's FHIR engine)"}
    from conf import Settings
    from models.appointments import ConnectorSession, Snapshot, SnapshotAppointment
    from models.directory import Organization
    from runtime import Runtime
    from workers.snapshot import night_window

    port = _free_port()
    origin = f"http://127.0.0.1:{port}"
    ehr = subprocess.Popen(["node", "fhir_ehr.mjs", "--port", str(port)], cwd=JS_DIR, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        for line in ehr.stdout:
            if line.startswith("ready "):
                break
        with scratch_database(postgres_url) as url:
            service = BenchService(url)
            service.start()
            settings = Settings.from_env(service.env, dotenv=None)
            runtime = Runtime(settings)
            try:
                now = runtime.clock.now()
                fleet = seed_fleet(runtime.db, service.application_id, ORGANIZATIONS, PHYSICIANS, now)
                Organization.update(ehr="fhir", ehr_url=f"{origin}/fhir/R4", fhir_client_id=CLIENT_ID).where(
                    Organization.id.in_(list(fleet))).execute()
                start, _ = night_window(settings, NIGHT)
                copy_rows(runtime.db, ConnectorSession, ["user_id", "started_at", "last_seen_at", "ended_at"],
                          ((u[0], start - dt.timedelta(hours=1), start, None) for users in fleet.values() for u in users))
                _post(f"{origin}/admin/client", {"client_id": CLIENT_ID, "jwks_uri": f"{service.url}/ehr/jwks.json"})
                rng = random.Random(7)
                resources = [{"resourceType": "Patient", "id": f"pt{n}", "name": [{"family": f"Family{n}",
                              "given": [f"Given{n}"]}], "birthDate": f"{1940 + n % 60}-0{1 + n % 9}-1{n % 10}",
                              "gender": ("female", "male")[n % 2]} for n in range(PATIENTS)]
                for users in fleet.values():
                    for user_id, npi, _name in users:
                        resources.append({"resourceType": "Practitioner", "id": f"pr{npi}", "identifier": [
                            {"system": NPI_SYSTEM, "value": npi}]})
                        for n in range(APPOINTMENTS_PER_PHYSICIAN):
                            begins = start + dt.timedelta(hours=8 + n * 18)
                            resources.append({
                                "resourceType": "Appointment", "id": f"ap{npi}-{n}", "status": "booked",
                                "start": begins.isoformat() + "Z", "end": (begins + dt.timedelta(minutes=30)).isoformat() + "Z",
                                "participant": [{"actor": {"reference": f"Practitioner/pr{npi}"}, "status": "accepted"},
                                                {"actor": {"reference": f"Patient/pt{rng.randrange(PATIENTS)}"},
                                                 "status": "accepted"}]})
                for chunk in range(0, len(resources), 2000):
                    _post(f"{origin}/admin/seed", {"resources": resources[chunk:chunk + 2000]})
                say(f"FHIR night: {ORGANIZATIONS} clinics x {PHYSICIANS} physicians, {len(resources):,} FHIR resources seeded")
                before = json.loads(urllib.request.urlopen(f"{origin}/admin/stats", timeout=30).read())
                began = time.monotonic()
                done = subprocess.run([sys.executable, "-m", "cli.__main__", "snapshot", "run", "--date",
                                       NIGHT.isoformat(), "--json"], env=service.env, cwd=str(ROOT),
                                      capture_output=True, text=True, timeout=3600)
                seconds = time.monotonic() - began
                after = json.loads(urllib.request.urlopen(f"{origin}/admin/stats", timeout=30).read())
                if done.returncode != 0:
                    raise RuntimeError(f"snapshot run failed: {done.stdout[-1000:]} {done.stderr[-2000:]}")
                rows = (SnapshotAppointment.select().join(Snapshot).where(
                    (Snapshot.snapshot_date == NIGHT) & Snapshot.organization.in_(list(fleet))).count())
            finally:
                runtime.close()
                service.stop()
    finally:
        ehr.terminate()
        ehr.wait(30)
    busy = (after["fhirBusyMs"] - before["fhirBusyMs"]) / 1000
    result = {"organizations": ORGANIZATIONS, "physicians_per_organization": PHYSICIANS, "seconds": round(seconds, 1),
              "appointments": rows, "appointments_per_second": round(rows / seconds, 1),
              "fhir_requests": after["fhir"] - before["fhir"], "token_requests": after["token"] - before["token"],
              "ehr_busy_seconds": round(busy, 1), "ehr_share": round(busy / seconds, 3), "cores": os.cpu_count()}
    say(f"FHIR night: {rows:,} appointments in {seconds:.1f} s ({result['appointments_per_second']:,}/s), "
        f"{result['fhir_requests']:,} FHIR requests, {result['token_requests']} token requests, "
        f"the EHR busy {100 * result['ehr_share']:.0f}% of the time")
    return result
