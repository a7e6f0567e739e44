"""Bulk Data export (issue 48 item 5): a `Patient/$export` of a sandbox clinic of N patients (10,000 by
default), every US Core type of the Patient compartment, as a partner's backend runs it.

The shape operators run: `svc-auth serve` and one `svc-auth worker` (one thread) on Redis (a
namespace of its own, removed after) and SQLite, the local object store. The backend signs a
client assertion (ES384), gets a system token, kicks off, polls the status URL every 0.5 s until
the manifest. Reported: the wall time from kick-off to manifest, the worker's CPU per exported
resource, the same as a ratio to the serve process's CPU per resource when the FHIR API renders
those types for a sample of the same patients in search pages (`{Type}?patient=X&_count=100`, each
(patient, type) asked once: nothing cached), and the peak RSS (VmHWM) of the worker and of serve.
The target: an exported resource costs at most the CPU of one resource in a search page (ratio <= 1).
"""
from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid

from bench.service import ROOT, BenchService

SAMPLE_PATIENTS = 40
US_CORE_PATIENT_TYPES = ("Patient", "AllergyIntolerance", "CarePlan", "CareTeam", "Condition", "Coverage", "Device",
                         "DiagnosticReport", "DocumentReference", "Encounter", "Goal", "Immunization",
                         "MedicationDispense", "MedicationRequest", "Observation", "Procedure", "Provenance",
                         "QuestionnaireResponse", "RelatedPerson", "ServiceRequest", "Specimen")
"""The US Core 6.1 types a Patient-level export writes (Appointment and FamilyMemberHistory have no profile)."""


def _vm(pid: int, field: str) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def _cpu(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _seed(service: BenchService, patients: int) -> dict:
    """The clinic's panel of `patients`, all on the physician's schedule, and a backend app (a key
    pair, `system/*.rs`) installed and Enabled there."""
    from cryptography.hazmat.primitives.asymmetric import ec
    from jwt.algorithms import ECAlgorithm

    from conf import Settings
    from connectors.sandbox import patient_panel
    from lifecycle.applications import install_application, register_application
    from lifecycle.backend_apps import set_backend_keys, set_system_scopes
    from models.application import ENABLED, Authorization, Installation
    from models.appointments import Snapshot, SnapshotAppointment
    from models.directory import Organization, User
    from runtime import Runtime
    runtime = Runtime(Settings.from_env(service.env, dotenv=None))
    org_id = service.organization_id
    Organization.update(ehr_url=f"https://ehr.example/bench?panel={patients}").where(Organization.id == org_id).execute()
    doctor = User.get_by_id(service.user_id)
    Authorization.create(application=service.application_id, user=doctor.id)
    day = dt.date.today()
    snapshot = Snapshot.create(organization=org_id, snapshot_date=day, status="complete", completed_at=dt.datetime.utcnow())
    start = dt.datetime.combine(day, dt.time(13, 0))
    rows = [{"snapshot": snapshot.id, "ehr_appointment_id": f"apt-bench-{n}", "provider": doctor.id,
             "provider_npi": doctor.npi, "provider_name": "Bench Doctor", "start": start, "end": start,
             "status": "booked", "appointment_type": "Follow-up", "reason": "", "location": "",
             "patient_id": p.id, "patient_first_name": p.first_name, "patient_last_name": p.last_name,
             "patient_date_of_birth": p.date_of_birth, "patient_sex": p.sex}
            for n, p in enumerate(patient_panel(org_id, patients))]
    with runtime.db.atomic():
        for offset in range(0, len(rows), 500):
            SnapshotAppointment.insert_many(rows[offset:offset + 500]).execute()
    key = ec.generate_private_key(ec.SECP384R1())
    kid = uuid.uuid4().hex[:12]
    jwk = {**json.loads(ECAlgorithm.to_jwk(key.public_key())), "kid": kid, "alg": "ES384", "use": "sig"}
    app, _ = register_application(runtime, "Bench Backend", "https://backend.example/cb", "https://backend.example/launch")
    set_backend_keys(runtime, app.id, jwks_text=json.dumps({"keys": [jwk]}))
    set_system_scopes(runtime, app.id, "system/*.rs")
    install_application(app.id, org_id)
    Installation.update(activation_status=ENABLED).where((Installation.application == app.id)
                                                         & (Installation.organization == org_id)).execute()
    runtime.close()
    return {"client_id": app.client_id, "key": key, "kid": kid,
            "patients": [p.id for p in patient_panel(org_id, patients)]}


def _token(service: BenchService, backend: dict) -> str:
    import jwt
    token_url = f"{service.url}/v1/oauth/token"
    assertion = jwt.encode({"iss": backend["client_id"], "sub": backend["client_id"], "aud": token_url,
                            "exp": int(time.time()) + 240, "jti": uuid.uuid4().hex},
                           backend["key"], algorithm="ES384", headers={"kid": backend["kid"]})
    body = urllib.parse.urlencode({"grant_type": "client_credentials", "scope": "system/*.rs",
                                   "client_assertion_type": "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
                                   "client_assertion": assertion}).encode()
    with urllib.request.urlopen(token_url, body) as answer:
        return json.load(answer)["access_token"]


def _get(url: str, token: str, headers: dict | None = None):
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}", **(headers or {})})
    with urllib.request.urlopen(request) as answer:
        return answer.status, dict(answer.headers), answer.read()


def bulk_export_benchmark(redis_url: str, say, patients: int = 10_000) -> dict:
    namespace = f"bench-bulk-{secrets.token_hex(4)}"
    service = BenchService(extra_env={"SVC_REDIS_URL": redis_url, "SVC_REDIS_NAMESPACE": namespace,
                                      "SVC_FHIR_RATE_LIMIT": "100000000/60",
                                      "SVC_FHIR_TOKEN_RATE_LIMIT": "100000000/60"})
    worker = None
    try:
        service.seed()
        backend = _seed(service, patients)
        service.start_seeded()
        log = open(service.tmp / "worker.log", "ab")
        worker = subprocess.Popen([sys.executable, "-m", "cli.__main__", "worker", "--threads", "1"], env=service.env,
                                  cwd=str(ROOT), stdout=log, stderr=subprocess.STDOUT)
        time.sleep(2)  # the worker's imports and broker connection, before the clock starts
        base = f"{service.url}/fhir/r4/{service.organization_id}"
        token = _token(service, backend)
        worker_cpu, serve_cpu = _cpu(worker.pid), service.cpu_seconds()
        started = time.perf_counter()
        _, headers, _ = _get(f"{base}/Patient/$export?_type={','.join(US_CORE_PATIENT_TYPES)}", token,
                             {"Accept": "application/fhir+json", "Prefer": "respond-async"})
        status_url = headers["Content-Location"]
        manifest, polls = None, 0
        while manifest is None:
            time.sleep(0.5)
            if time.perf_counter() - started > 200:  # the token lives 300 s
                token = _token(service, backend)
            status, _, body = _get(status_url, token)
            polls += 1
            if status == 200:
                manifest = json.loads(body)
        seconds = time.perf_counter() - started
        export_cpu = _cpu(worker.pid) - worker_cpu
        serve_cpu_export = service.cpu_seconds() - serve_cpu
        resources = sum(o["count"] for o in manifest["output"])
        worker_peak = _vm(worker.pid, "VmHWM")
        say(f"bulk export: {patients} patients, {resources} resources in {len(manifest['output'])} files, "
            f"{seconds:.1f} s; worker {1e6 * export_cpu / resources:.1f} µs CPU per resource, peak RSS "
            f"{worker_peak:.0f} MB")
        # The same types rendered by the FHIR API, for a sample of the same patients, in search pages.
        token = _token(service, backend)
        searched, before = 0, service.cpu_seconds()
        step = max(1, patients // SAMPLE_PATIENTS)
        for patient in backend["patients"][::step][:SAMPLE_PATIENTS]:
            for kind in US_CORE_PATIENT_TYPES:
                query = urllib.parse.urlencode({("_id" if kind == "Patient" else "patient"): patient, "_count": 100})
                _, _, body = _get(f"{base}/{kind}?{query}", token, {"Accept": "application/fhir+json"})
                searched += len(json.loads(body).get("entry", ()))
        search_cpu = service.cpu_seconds() - before
        per_export = export_cpu / resources
        per_search = search_cpu / max(1, searched)
        result = {
            "patients": patients, "types": len(US_CORE_PATIENT_TYPES), "resources": resources,
            "files": len(manifest["output"]), "seconds": round(seconds, 1), "polls": polls,
            "resources_per_second": round(resources / seconds),
            "worker_cpu_seconds": round(export_cpu, 1), "worker_cpu_us_per_resource": round(1e6 * per_export, 1),
            "serve_cpu_seconds_during_export": round(serve_cpu_export, 2),
            "search_sample_patients": SAMPLE_PATIENTS, "search_resources": searched,
            "search_cpu_us_per_resource": round(1e6 * per_search, 1),
            "cpu_ratio_export_to_search": round(per_export / per_search, 3),
            "worker_peak_rss_mb": round(worker_peak, 1), "serve_peak_rss_mb": round(_vm(service.proc.pid, "VmHWM"), 1),
            "target": "cpu_ratio_export_to_search <= 1",
        }
        say(f"FHIR API search pages of the same types: {result['search_cpu_us_per_resource']} µs CPU per resource; "
            f"export/search ratio {result['cpu_ratio_export_to_search']}; serve peak RSS {result['serve_peak_rss_mb']} MB")
        return result
    finally:
        if worker is not None and worker.poll() is None:
            worker.terminate()
            worker.wait(30)
        service.stop()
        try:
            import redis
            client = redis.Redis.from_url(redis_url)
            for key in client.scan_iter(f"{namespace}:*"):
                client.delete(key)
        except Exception:  # noqa: BLE001 (a bench's cleanup: Redis gone is not the figure's problem)
            pass


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--patients", type=int, default=10_000)
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = parser.parse_args()
    print(json.dumps(bulk_export_benchmark(args.redis_url, print, args.patients), indent=2))
