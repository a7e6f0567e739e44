"""The framework's per-request floor: this checkout against a baseline commit, alternating (issue 37).

Both `serve --processes 1` (embedded, SQLite: no database or signing in `/healthz`) are up for the
whole run, the baseline from its own tree (`git archive REV`, run with this checkout's
virtualenv). wrk drives `/healthz`, then a `client_credentials` token, against one and then the
other, FLOOR_ROUNDS rounds in ABBA order (this, baseline, baseline, this, ...), so the machine's
drift falls on both alike. Figures: requests per CPU-second of the serve process (sums over the
rounds), median p99, and the ratio this ÷ baseline (target for `/healthz`: >= 1.3).
"""
from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from pathlib import Path

from bench import loadgen
from bench.remote_db import _proc_cpu
from bench.service import ROOT, BenchService

FLOOR_ROUNDS = 6
CONNECTIONS = 16
HEALTHZ_TARGET = 1.3


@contextlib.contextmanager
def baseline_tree(rev: str):
    """The files of commit `rev` in a temporary directory (removed afterwards); yields its path
    and the full commit id."""
    commit = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.strip()
    tmp = Path(tempfile.mkdtemp(prefix="svc-baseline-"))
    try:
        archive = subprocess.Popen(["git", "archive", commit], cwd=ROOT, stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(tmp)], stdin=archive.stdout, check=True)
        archive.wait()
        yield tmp, commit
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def measured(service: BenchService, path: str, lua: str, seconds: float, env: dict | None = None) -> dict:
    before = _proc_cpu(service.proc.pid)
    run = loadgen.run(service.url + path, lua, CONNECTIONS, seconds, env=env)
    run["cpu_seconds"] = round(_proc_cpu(service.proc.pid) - before, 3)
    return run


def floor_benchmarks(baseline: str, seconds: float, say) -> dict:
    with baseline_tree(baseline) as (tree, commit):
        services = {"this": BenchService(None), f"baseline {commit[:7]}": BenchService(None, root=tree)}
        try:
            for service in services.values():
                service.start()
            loads = {"/healthz": ("/healthz", "get", lambda s: None),
                     "client_credentials": ("/v1/oauth/token", "post", lambda s: {
                         "BENCH_BODY": "grant_type=client_credentials", "BENCH_AUTHORIZATION": s.client_auth})}
            for service in services.values():  # warm-up, not counted
                for path, lua, env in loads.values():
                    loadgen.run(service.url + path, lua, CONNECTIONS, min(seconds, 2.0), env=env(service))
            runs = {name: {load: [] for load in loads} for name in services}
            names = list(services)
            for number in range(FLOOR_ROUNDS):
                for name in (names if number % 2 == 0 else names[::-1]):
                    service = services[name]
                    for load, (path, lua, env) in loads.items():
                        run = measured(service, path, lua, seconds, env(service))
                        runs[name][load].append(run)
                        say(f"floor round {number + 1}, {name}, {load}: {run['rps']:.0f}/s, "
                            f"{run['rps'] * run['seconds'] / max(run['cpu_seconds'], 1e-9):.0f} per CPU-s, "
                            f"p99 {run['p99_ms']:.2f} ms, errors {run['errors'] or 'none'}")
        finally:
            for service in services.values():
                service.stop()
    summary: dict = {}
    for name in names:
        summary[name] = {}
        for load, load_runs in runs[name].items():
            done = sum(r["rps"] * r["seconds"] for r in load_runs)
            cpu = sum(r["cpu_seconds"] for r in load_runs)
            p99s = sorted(r["p99_ms"] for r in load_runs)
            summary[name][load] = {"per_cpu_second": round(done / max(cpu, 1e-9), 1),
                                   "cpu_ms_per_request": round(1000 * cpu / max(done, 1), 4),
                                   "p99_ms_median": p99s[len(p99s) // 2], "rounds": load_runs}
    ratios = {load: round(summary[names[0]][load]["per_cpu_second"] / max(summary[names[1]][load]["per_cpu_second"], 1e-9), 3)
              for load in loads}
    say(f"floor: this ÷ baseline {commit[:7]} per CPU-second: "
        + ", ".join(f"{load} {ratio:.2f}" for load, ratio in ratios.items())
        + f" (target /healthz >= {HEALTHZ_TARGET}: {'meets' if ratios['/healthz'] >= HEALTHZ_TARGET else 'misses'})")
    return {"baseline": commit, "rounds": FLOOR_ROUNDS, "connections": CONNECTIONS, "seconds": seconds,
            "names": names, "shapes": summary, "ratios": ratios, "target": {"/healthz": HEALTHZ_TARGET}}
