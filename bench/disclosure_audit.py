"""What the disclosure audit costs a FHIR read (issue 27): `GET Patient/{id}` per CPU-second of
every process doing the work, with SVC_DISCLOSURE_AUDIT on and off, in the embedded shape (SQLite,
one process) and, when PostgreSQL and Redis are reachable, the production shape (2 processes). The
record is committed before each response completes (a group commit per process). Target: with the
audit on, at least 85% of the reads per CPU-second of a run without it.

Both services of a shape run side by side, and the load alternates between them in rounds (off, on,
on, off, ...): this machine's 2 shared cores change speed from one minute to the next (one 5 s
measurement of the same service varied by 30%), and alternating makes the drift fall on both sides
alike. The ratio is that of the totals: reads over CPU-seconds, with the audit over without.
"""
from __future__ import annotations

import contextlib
import secrets

from bench.fhir_reads import NO_FHIR_LIMITS, Measured, _sandbox_patient
from bench.fleet import redis_namespace, scratch_database
from bench.production import redis_server_pid
from bench.service import BenchService

TARGET = 0.85
ROUNDS = 6
ORDER = (("off", "on"), ("on", "off"))


def _target(service: BenchService) -> tuple[str, dict]:
    token = service.platform_token()
    patient = _sandbox_patient(service, token)
    return f"/fhir/r4/{service.organization_id}/Patient/{patient}", {"BENCH_AUTHORIZATION": f"Bearer {token}"}


def _total(runs: list[dict]) -> dict:
    """The rounds of one side, summed: reads, CPU-seconds, reads per CPU-second."""
    reads = sum(r["rps"] * r["seconds"] for r in runs)
    cpu = sum(sum(v for k, v in r["cpu_seconds"].items() if k != "ehr") for r in runs)
    errors: dict = {}
    for r in runs:
        for name, count in r["errors"].items():
            errors[name] = errors.get(name, 0) + count
    by_process = {group: round(sum(r["cpu_seconds"][group] for r in runs), 3) for group in runs[0]["cpu_seconds"]}
    return {"reads": round(reads), "cpu_seconds": round(cpu, 3), "per_cpu_second": round(reads / max(cpu, 1e-9), 1),
            "cpu_ms_per_read": {g: round(1000 * v / max(reads, 1), 3) for g, v in by_process.items() if v},
            "rounds": [r["per_cpu_second"] for r in runs], "errors": errors,
            "p50_ms": sorted(r["p50_ms"] for r in runs)[len(runs) // 2]}


def _shape(name: str, start, seconds: float, say) -> dict:
    """One shape: a service with the audit off and one with it on (each on a fresh database;
    `start(audit, stack)` registers its own cleanup), loaded in alternating rounds."""
    with contextlib.ExitStack() as stack:
        sides = {audit: start(audit, stack) for audit in ("off", "on")}
        targets = {audit: _target(service) for audit, (service, _) in sides.items()}
        runs: dict = {"off": [], "on": []}
        for round_ in range(ROUNDS):
            for audit in ORDER[round_ % 2]:
                path, env = targets[audit]
                runs[audit].append(sides[audit][1].run(path, "get", env, seconds, warm_up=round_ == 0))
    totals = {audit: _total(r) for audit, r in runs.items()}
    ratio = round(totals["on"]["per_cpu_second"] / max(totals["off"]["per_cpu_second"], 1e-9), 3)
    say(f"disclosure audit, {name}: Patient reads per CPU-s {totals['on']['per_cpu_second']:.0f} with the audit, "
        f"{totals['off']['per_cpu_second']:.0f} without ({ratio:.2f}; target >= {TARGET}; rounds on "
        f"{totals['on']['rounds']}, off {totals['off']['rounds']}); "
        f"errors {[k for k, t in totals.items() if t['errors']] or 'none'}")
    return {"shape": name, "audit_on": totals["on"], "audit_off": totals["off"], "on_vs_off": ratio}


def _embedded(audit: str, stack):
    service = BenchService(None, processes=1, extra_env={**NO_FHIR_LIMITS, "SVC_DISCLOSURE_AUDIT": audit}).start()
    stack.callback(service.stop)
    return service, Measured(service)


def _production(postgres_url: str, redis_url: str):
    def start(audit: str, stack):
        namespace = stack.enter_context(redis_namespace(redis_url, f"svc-bench-{secrets.token_hex(4)}"))
        db_url = stack.enter_context(scratch_database(postgres_url))
        service = BenchService(db_url, processes=2, extra_env={
            **NO_FHIR_LIMITS, "SVC_REDIS_URL": redis_url, "SVC_REDIS_NAMESPACE": namespace, "SVC_DISCLOSURE_AUDIT": audit}).start()
        stack.callback(service.stop)
        return service, Measured(service, postgres_url, db_url.rsplit("/", 1)[1], redis_server_pid(redis_url))
    return start


def disclosure_audit_benchmarks(postgres_url: str | None, redis_url: str | None, seconds: float, say) -> dict:
    result: dict = {"target_on_vs_off": TARGET, "shapes": [_shape("embedded (SQLite, 1 process)", _embedded, seconds, say)]}
    if postgres_url and redis_url:
        result["shapes"].append(_shape("production (PostgreSQL + Redis, 2 processes)",
                                       _production(postgres_url, redis_url), seconds, say))
    return result


def render(d: dict) -> list[str]:
    rows = [f"**Disclosure audit** (`GET Patient/{{id}}` per CPU-second of every process doing the work, "
            f"SVC_DISCLOSURE_AUDIT on vs off, both services up, {ROUNDS} alternating rounds each; "
            f"measured {d['started_at']}):", "",
            "| shape | audit on | audit off | on ÷ off | target |", "|---|---|---|---|---|"]
    for s in d["shapes"]:
        verdict = "meets" if s["on_vs_off"] >= d["target_on_vs_off"] else "**misses**"
        rows.append(f"| {s['shape']} | {s['audit_on']['per_cpu_second']:.0f} | {s['audit_off']['per_cpu_second']:.0f} | "
                    f"{s['on_vs_off']:.2f} | ≥ {d['target_on_vs_off']} ({verdict}) |")
    return rows + [""]
