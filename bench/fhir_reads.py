"""The platform FHIR API's reads beside the framework's floor and a token, per CPU-second (issue 29).

Each shape runs one `svc-auth serve` on a clinic and measures, with wrk at 16 connections after a
warm-up, requests per CPU-second of every process that does the work (the serve processes; in the
production shape also their PostgreSQL backends and the Redis server):

- `/healthz`: the framework's floor (Tornado, the access log, metrics);
- `client_credentials`: a token (one RS256 signature);
- `GET Patient/{id}` and `GET Observation?patient={id}&_count=50` on the sandbox clinic;
- `GET Patient/{id}` on a clinic whose EHR is the test FHIR EHR (`tests/js/fhir_ehr.mjs`, open mode):
  svc-auth's CPU per proxied read ÷ its CPU per `/healthz`, beside the EHR's own CPU per read.

Shapes: embedded (SQLite, one process, no Redis) and production (PostgreSQL + Redis, 2 processes).

With `--baseline REV` (issue 35 item 6), each shape runs this checkout and commit REV (`git archive`,
this checkout's virtualenv: `bench.floor.baseline_tree`) both up, each on its own database, and
drives every load against one and then the other, BASELINE_ROUNDS rounds in ABBA order, so the
machine's drift falls on both alike: per CPU-second sums over the rounds, this ÷ baseline per
load, and each side's reads ÷ its own `/healthz`.
"""
from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import urllib.request
from pathlib import Path
from types import MappingProxyType

from bench import loadgen
from bench.fleet import redis_namespace, scratch_database
from bench.production import process_tree, redis_server_pid
from bench.remote_db import _proc_cpu, backend_pids
from bench.service import BenchService

ROOT = Path(__file__).resolve().parent.parent
JS_DIR = ROOT / "tests" / "js"
CONNECTIONS = 16
BASELINE_ROUNDS = 4
"""Rounds of every load against each side with `--baseline` (ABBA order)."""
OBSERVATIONS = 100
"""The searched patient has this many Observations (or the nearest count): a page of 50 and a
total counted over 100."""
"""Rounds of every load against each side with `--baseline` (ABBA order)."""
TARGETS = MappingProxyType({"patient_read_vs_healthz": 0.5, "observation_search_vs_healthz": 0.2,
                            "proxied_read_cpu_vs_healthz_cpu": 2.5})
# The FHIR API's limits stay on (their limiter call is part of each read's cost) but are never
# reached: one token reads thousands a second here, CONNECTIONS at once to one clinic's EHR.
NO_FHIR_LIMITS = MappingProxyType({"SVC_FHIR_RATE_LIMIT": "100000000/60", "SVC_FHIR_TOKEN_RATE_LIMIT": "100000000/60",
                                   "SVC_FHIR_EHR_CONCURRENCY": str(CONNECTIONS * 8)})
"""No limit the load could meet: the rate limits far above it, and EHR slots for 8 times its connections
(wrk's warm-up run leaves requests in flight when the measured run opens its own connections)."""


class Measured:
    """One running service and the processes whose CPU its requests cost."""

    def __init__(self, service: BenchService, admin_url: str | None = None, database: str | None = None,
                 redis_pid: int | None = None, extra_pids=()):
        self.service, self.admin_url, self.database, self.redis_pid = service, admin_url, database, redis_pid
        self.extra_pids = list(extra_pids)

    def groups(self) -> dict[str, list[int]]:
        return {"serve": process_tree(self.service.proc.pid),
                "postgres": backend_pids(self.admin_url, self.database) if self.admin_url else [],
                "redis": [self.redis_pid] if self.redis_pid else [], "ehr": self.extra_pids}

    def run(self, path: str, lua: str, env: dict, seconds: float, warm_up: bool = True) -> dict:
        if warm_up:
            loadgen.run(self.service.url + path, lua, CONNECTIONS, min(seconds, 1.0), env=env)
        groups = self.groups()
        before = {pid: _proc_cpu(pid) for members in groups.values() for pid in members}
        result = loadgen.run(self.service.url + path, lua, CONNECTIONS, seconds, env=env)
        used = {group: round(sum(max(0.0, _proc_cpu(pid) - before[pid]) for pid in members), 3)
                for group, members in groups.items()}
        ok = result["rps"] * result["seconds"]
        ours = sum(v for k, v in used.items() if k != "ehr")
        result.update({"cpu_seconds": used, "per_cpu_second": round(ok / max(ours, 1e-9), 1),
                       "svc_cpu_ms_per_request": round(1000 * ours / max(ok, 1), 3),
                       "ehr_cpu_ms_per_request": round(1000 * used["ehr"] / max(ok, 1), 3)})
        return result


def _sandbox_patient(service: BenchService, token: str) -> str:
    """The clinic's patient whose Observations number nearest OBSERVATIONS (the first of those):
    the generator gives each patient 12 to 160 (its clinic id decides), so services compared in
    one run (each seeds a clinic of its own) search pages and totals of the same size."""
    base = f"/fhir/r4/{service.organization_id}"
    status, bundle = service.get_json(f"{base}/Patient?_count=1000", token)
    if status != 200 or not bundle.get("entry"):
        raise RuntimeError(f"the sandbox clinic lists no patient: {status} {bundle}")
    best, best_total = None, None
    for entry in bundle["entry"]:
        ident = entry["resource"]["id"]
        total = service.get_json(f"{base}/Observation?patient={ident}&_count=1", token)[1].get("total", 0)
        if best is None or abs(total - OBSERVATIONS) < abs(best_total - OBSERVATIONS):
            best, best_total = ident, total
        if total == OBSERVATIONS:
            break
    return best


def _loads(service: BenchService) -> dict[str, tuple[str, str, dict]]:
    """The section's requests on `service`: name -> (path, wrk script, its environment)."""
    token = service.platform_token()
    bearer = {"BENCH_AUTHORIZATION": f"Bearer {token}"}
    patient = _sandbox_patient(service, token)
    base = f"/fhir/r4/{service.organization_id}"
    return {"healthz": ("/healthz", "get", {}),
            "client_credentials": ("/v1/oauth/token", "post", {
                "BENCH_BODY": "grant_type=client_credentials", "BENCH_AUTHORIZATION": service.client_auth}),
            "patient_read": (f"{base}/Patient/{patient}", "get", bearer),
            "observation_search": (f"{base}/Observation?patient={patient}&_count=50", "get", bearer)}


def _shape(name: str, measured: Measured, seconds: float, say) -> dict:
    runs = {load: measured.run(path, lua, env, seconds) for load, (path, lua, env) in _loads(measured.service).items()}
    return _shape_summary(name, runs, say)


def _shape_summary(name: str, runs: dict, say) -> dict:
    floor = runs["healthz"]["per_cpu_second"]
    ratios = {f"{key}_vs_healthz": round(run["per_cpu_second"] / floor, 3) for key, run in runs.items()
              if key != "healthz"}
    say(f"{name}: per CPU-s /healthz {floor:.0f}, token {runs['client_credentials']['per_cpu_second']:.0f}, "
        f"Patient read {runs['patient_read']['per_cpu_second']:.0f} ({ratios['patient_read_vs_healthz']:.2f}), "
        f"Observation search {runs['observation_search']['per_cpu_second']:.0f} "
        f"({ratios['observation_search_vs_healthz']:.2f}); errors "
        f"{[k for k, r in runs.items() if r['errors']] or 'none'}")
    return {"shape": name, **runs, "ratios": ratios}


def _proxied(measured: Measured, ehr_origin: str, seconds: float, say) -> dict:
    """Reads through a clinic on the test FHIR EHR (open mode): svc-auth's CPU per read vs /healthz."""
    path, env = _proxied_clinic(measured.service, ehr_origin)
    read = measured.run(path, "get", env, seconds)
    healthz = measured.run("/healthz", "get", {}, seconds)
    ratio = round(read["svc_cpu_ms_per_request"] / max(healthz["svc_cpu_ms_per_request"], 1e-9), 2)
    say(f"proxied Patient read: {read['rps']:.0f}/s, svc-auth {read['svc_cpu_ms_per_request']:.3f} CPU ms per read "
        f"({ratio}x /healthz's {healthz['svc_cpu_ms_per_request']:.3f}), the EHR {read['ehr_cpu_ms_per_request']:.3f} "
        f"CPU ms per read; errors {read['errors'] or 'none'}")
    return {"read": read, "healthz": healthz, "svc_cpu_per_read_vs_healthz": ratio}


def _proxied_clinic(service: BenchService, ehr_origin: str) -> tuple[str, dict]:
    """A clinic of `service` on the test EHR at `ehr_origin`, its patient seeded: (the read's path, wrk's env)."""
    from conf import Settings
    from lifecycle.applications import install_application
    from lifecycle.organizations import create_organization
    from lifecycle.users import create_user
    from runtime import Runtime
    runtime = Runtime(Settings.from_env(service.env, dotenv=None))
    try:
        org = create_organization("Bench FHIR Clinic", "fhir", f"{ehr_origin}/fhir/R4", fhir_auth="none")
        install_application(service.application_id, org.id)
        user = create_user(org.id, "fhir-doc@bench.example", "Fhir", "Doctor", "fdoc", "1234567893")
    finally:
        runtime.close()
    request = urllib.request.Request(f"{ehr_origin}/admin/seed", method="POST", data=json.dumps({"resources": [
        {"resourceType": "Patient", "id": "bench-pt", "name": [{"family": "Bench", "given": ["Patient"]}],
         "birthDate": "1970-01-01", "gender": "female"}]}).encode())
    urllib.request.urlopen(request, timeout=60).read()
    token = service.platform_token(organization_id=org.id, user_id=user.id)
    return f"/fhir/r4/{org.id}/Patient/bench-pt", {"BENCH_AUTHORIZATION": f"Bearer {token}"}


def _start_ehr():
    from bench.service import free_port
    port = free_port()
    ehr = subprocess.Popen(["node", "fhir_ehr.mjs", "--port", str(port), "--open"], cwd=JS_DIR,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in ehr.stdout:
        if line.startswith("ready "):
            return ehr, f"http://127.0.0.1:{port}"
    raise RuntimeError("the test FHIR EHR did not start")


def _alternating(name: str, sides: dict[str, Measured], seconds: float, say) -> dict:
    """Every load against each side (this checkout, the baseline), BASELINE_ROUNDS rounds in ABBA
    order after a warm-up of each; per CPU-second sums over the rounds, and this ÷ baseline."""
    loads = {side: _loads(measured.service) for side, measured in sides.items()}
    for side, measured in sides.items():  # warm-up, not counted
        for path, lua, env in loads[side].values():
            loadgen.run(measured.service.url + path, lua, CONNECTIONS, min(seconds, 2.0), env=env)
    names = list(sides)
    runs: dict = {side: {load: [] for load in loads[side]} for side in names}
    for number in range(BASELINE_ROUNDS):
        for side in (names if number % 2 == 0 else names[::-1]):
            for load, (path, lua, env) in loads[side].items():
                run = sides[side].run(path, lua, env, seconds, warm_up=False)
                runs[side][load].append(run)
                say(f"{name} round {number + 1}, {side}, {load}: {run['rps']:.0f}/s, {run['per_cpu_second']:.0f} "
                    f"per CPU-s, errors {run['errors'] or 'none'}")
    summary = {}
    for side in names:
        summary[side] = {}
        for load, load_runs in runs[side].items():
            done = sum(r["rps"] * r["seconds"] for r in load_runs)
            cpu = sum(v for r in load_runs for k, v in r["cpu_seconds"].items() if k != "ehr")
            summary[side][load] = {"per_cpu_second": round(done / max(cpu, 1e-9), 1),
                                   "svc_cpu_ms_per_request": round(1000 * cpu / max(done, 1), 4),
                                   "errors": {k: v for r in load_runs for k, v in r["errors"].items()},
                                   "rounds": load_runs}
    for side in names:
        floor = summary[side]["healthz"]["per_cpu_second"]
        summary[side]["ratios"] = {f"{load}_vs_healthz": round(run["per_cpu_second"] / floor, 3)
                                   for load, run in summary[side].items() if load not in ("healthz", "ratios")}
    this, baseline = names
    ratios = {load: round(summary[this][load]["per_cpu_second"] / max(summary[baseline][load]["per_cpu_second"], 1e-9), 3)
              for load in loads[this]}
    say(f"{name}: this ÷ {baseline} per CPU-second: " + ", ".join(f"{load} {r:.2f}" for load, r in ratios.items())
        + f"; ÷ /healthz this {summary[this]['ratios']['patient_read_vs_healthz']:.2f} / "
          f"{summary[this]['ratios']['observation_search_vs_healthz']:.2f}, baseline "
          f"{summary[baseline]['ratios']['patient_read_vs_healthz']:.2f} / "
          f"{summary[baseline]['ratios']['observation_search_vs_healthz']:.2f}")
    return {"shape": name, "names": names, "sides": summary, "this_vs_baseline": ratios}


def _against_baseline(baseline: str, postgres_url: str | None, redis_url: str | None, seconds: float, say) -> dict:
    """This checkout and commit `baseline` both up, alternating (`_alternating`), in the embedded
    shape and (PostgreSQL and Redis given) the production shape, each service on its own database."""
    from bench.floor import baseline_tree
    result: dict = {"rounds": BASELINE_ROUNDS, "seconds": seconds, "shapes": []}
    with baseline_tree(baseline) as (tree, commit), contextlib.ExitStack() as stack:
        result["baseline"] = commit
        sides = {"this": {}, f"baseline {commit[:7]}": {"root": tree}}
        services = {side: stack.enter_context(_started(BenchService(None, processes=1, extra_env=dict(NO_FHIR_LIMITS),
                                                                    **kwargs)))
                    for side, kwargs in sides.items()}
        result["shapes"].append(_alternating("embedded (SQLite, 1 process)",
                                             {side: Measured(s) for side, s in services.items()}, seconds, say))
        stack.close()
        if postgres_url and redis_url:
            measured = {}
            for side, kwargs in sides.items():
                db_url = stack.enter_context(scratch_database(postgres_url))
                namespace = f"svc-bench-{secrets.token_hex(4)}"
                stack.enter_context(redis_namespace(redis_url, namespace))
                service = stack.enter_context(_started(BenchService(db_url, processes=2, extra_env={
                    **NO_FHIR_LIMITS, "SVC_REDIS_URL": redis_url, "SVC_REDIS_NAMESPACE": namespace}, **kwargs)))
                measured[side] = Measured(service, postgres_url, db_url.rsplit("/", 1)[1], redis_server_pid(redis_url))
            result["shapes"].append(_alternating("production (PostgreSQL + Redis, 2 processes)", measured, seconds, say))
    return result


@contextlib.contextmanager
def _started(service: BenchService):
    service.start()
    try:
        yield service
    finally:
        service.stop()


def fhir_reads_benchmarks(postgres_url: str, redis_url: str | None, seconds: float, say,
                          baseline: str | None = None) -> dict:
    """The section; with `baseline` (a commit), each shape is measured as this checkout against it,
    alternating (`_against_baseline`), and the shapes' figures are this checkout's from that run."""
    result: dict = {"connections": CONNECTIONS, "targets": dict(TARGETS), "shapes": []}
    if baseline:
        compared = result["against_baseline"] = _against_baseline(baseline, postgres_url, redis_url, seconds, say)
        result["shapes"] = [{"shape": shape["shape"], **shape["sides"]["this"]} for shape in compared["shapes"]]
        postgres_url = redis_url = None  # measured above
    embedded = BenchService(None, processes=1, extra_env=dict(NO_FHIR_LIMITS)).start()
    ehr = None
    try:
        measured = Measured(embedded)
        if not baseline:
            result["shapes"].append(_shape("embedded (SQLite, 1 process)", measured, seconds, say))
        if (JS_DIR / "node_modules" / "@medplum" / "fhir-router").exists():
            ehr, origin = _start_ehr()
            measured.extra_pids = [ehr.pid]
            result["proxied"] = _proxied(measured, origin, seconds, say)
        else:
            result["proxied"] = {"skipped": "tests/js is not installed (make test installs Medplum's FHIR engine)"}
    finally:
        embedded.stop()
        if ehr is not None:
            ehr.terminate()
            ehr.wait(30)
    if postgres_url and redis_url:
        namespace = f"svc-bench-{secrets.token_hex(4)}"
        with scratch_database(postgres_url) as db_url, redis_namespace(redis_url, namespace):
            production = BenchService(db_url, processes=2, extra_env={
                **NO_FHIR_LIMITS, "SVC_REDIS_URL": redis_url, "SVC_REDIS_NAMESPACE": namespace}).start()
            try:
                measured = Measured(production, postgres_url, db_url.rsplit("/", 1)[1], redis_server_pid(redis_url))
                result["shapes"].append(_shape("production (PostgreSQL + Redis, 2 processes)", measured, seconds, say))
            finally:
                production.stop()
    return result
