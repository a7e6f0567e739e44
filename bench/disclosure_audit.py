"""What the disclosure audit costs a FHIR read (issue 27): `GET Patient/{id}` per CPU-second of
every process doing the work, with SVC_DISCLOSURE_AUDIT on and off, in the embedded shape (SQLite,
one process) and, when PostgreSQL and Redis are reachable, the production shape (2 processes). The
record is committed before each response completes, so its cost is one INSERT under the chain's
lock per read. Target: with the audit on, at least 85% of the reads per CPU-second of a run without it.
"""
from __future__ import annotations

import contextlib
import secrets

from bench.fhir_reads import NO_FHIR_LIMITS, Measured, _sandbox_patient
from bench.fleet import redis_namespace, scratch_database
from bench.production import redis_server_pid
from bench.service import BenchService

TARGET = 0.85


def _reads(service: BenchService, measured: Measured, seconds: float) -> dict:
    token = service.platform_token()
    patient = _sandbox_patient(service, token)
    return measured.run(f"/fhir/r4/{service.organization_id}/Patient/{patient}", "get",
                        {"BENCH_AUTHORIZATION": f"Bearer {token}"}, seconds)


def _shape(name: str, start, seconds: float, say) -> dict:
    """One shape, audit off then on (each a fresh service on a fresh database; `start(audit, stack)`
    registers its own cleanup on the ExitStack)."""
    runs = {}
    for audit in ("off", "on"):
        with contextlib.ExitStack() as stack:
            service, measured = start(audit, stack)
            runs[audit] = _reads(service, measured, seconds)
    ratio = round(runs["on"]["per_cpu_second"] / max(runs["off"]["per_cpu_second"], 1e-9), 3)
    say(f"disclosure audit, {name}: Patient reads per CPU-s {runs['on']['per_cpu_second']:.0f} with the audit, "
        f"{runs['off']['per_cpu_second']:.0f} without ({ratio:.2f}; target >= {TARGET}); "
        f"errors {[k for k, r in runs.items() if r['errors']] or 'none'}")
    return {"shape": name, "audit_on": runs["on"], "audit_off": runs["off"], "on_vs_off": ratio}


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
            f"SVC_DISCLOSURE_AUDIT on vs off; measured {d['started_at']}):", "",
            "| shape | audit on | audit off | on ÷ off | target |", "|---|---|---|---|---|"]
    for s in d["shapes"]:
        verdict = "meets" if s["on_vs_off"] >= d["target_on_vs_off"] else "**misses**"
        rows.append(f"| {s['shape']} | {s['audit_on']['per_cpu_second']:.0f} | {s['audit_off']['per_cpu_second']:.0f} | "
                    f"{s['on_vs_off']:.2f} | ≥ {d['target_on_vs_off']} ({verdict}) |")
    return rows + [""]
