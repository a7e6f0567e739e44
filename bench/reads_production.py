"""`python -m bench.reads_production --baseline REV [--seconds S] [--rounds N]`: FHIR reads in the
production shape only (PostgreSQL + Redis, `serve --processes 2`), this checkout against commit REV,
both up, alternating ABBA (issue 49 item 3).

`bench.fhir_reads --baseline` without its embedded shape and its token load: `/healthz`, the
Patient read and the page of 50, each side on its own scratch database and Redis namespace; CPU
per request by process group (serve, the scratch database's PostgreSQL backends, the Redis server)
summed over the rounds, and each side's reads ÷ its own `/healthz` per CPU-second.

`--together`: each round drives both sides at once (CONNECTIONS each, two wrk processes) instead of
one after the other, so both see the same minute of a machine shared with other work: each side's
CPU is still its own processes', over the same window (the one Redis server's counts on both sides:
about 1% of a read's).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import secrets
from concurrent.futures import ThreadPoolExecutor

from bench.fhir_reads import NO_FHIR_LIMITS, Measured, _loads, _started
from bench.fleet import DEFAULT_POSTGRES_URL, redis_namespace, scratch_database
from bench.floor import baseline_tree
from bench.production import redis_server_pid
from bench.service import BenchService

LOADS = ("healthz", "patient_read", "observation_search")


def _sides(stack, baseline_root, postgres_url: str, redis_url: str) -> dict:
    measured = {}
    for side, kwargs in (("this", {}), ("baseline", {"root": baseline_root})):
        db_url = stack.enter_context(scratch_database(postgres_url))
        namespace = f"svc-bench-{secrets.token_hex(4)}"
        stack.enter_context(redis_namespace(redis_url, namespace))
        service = stack.enter_context(_started(BenchService(db_url, processes=2, extra_env={
            **NO_FHIR_LIMITS, "SVC_REDIS_URL": redis_url, "SVC_REDIS_NAMESPACE": namespace}, **kwargs)))
        measured[side] = Measured(service, postgres_url, db_url.rsplit("/", 1)[1], redis_server_pid(redis_url))
    return measured


def _note(runs: dict, number: int, side: str, name: str, run: dict) -> None:
    runs[side][name].append(run)
    print(f"round {number + 1} {side} {name}: {run['rps']:.0f}/s, {run['svc_cpu_ms_per_request']:.3f} ms, errors "
          f"{run['errors'] or 'none'}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--together", action="store_true", help="drive both sides at once in each round")
    parser.add_argument("--postgres-url", default=os.environ.get("BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL))
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = parser.parse_args()
    with baseline_tree(args.baseline) as (tree, commit), contextlib.ExitStack() as stack:
        sides = _sides(stack, tree, args.postgres_url, args.redis_url)
        loads = {side: {name: load for name, load in _loads(m.service).items() if name in LOADS}
                 for side, m in sides.items()}
        for side, m in sides.items():  # warm-up, not counted
            for path, lua, env in loads[side].values():
                m.run(path, lua, env, 2.0, warm_up=False)
        runs = {side: {name: [] for name in LOADS} for side in sides}
        print(f"baseline {commit[:7]}, load average {os.getloadavg()[0]:.2f}", flush=True)
        for number in range(args.rounds):
            if args.together:
                with ThreadPoolExecutor(len(sides)) as both:
                    for name in LOADS:
                        futures = {side: both.submit(sides[side].run, *loads[side][name], args.seconds, warm_up=False)
                                   for side in sides}
                        for side, future in futures.items():
                            _note(runs, number, side, name, future.result())
                continue
            for side in (list(sides) if number % 2 == 0 else list(sides)[::-1]):
                for name, (path, lua, env) in loads[side].items():
                    _note(runs, number, side, name, sides[side].run(path, lua, env, args.seconds, warm_up=False))
        print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        for side in sides:
            per = {}
            for name in LOADS:
                done = sum(r["rps"] * r["seconds"] for r in runs[side][name])
                groups = {g: sum(r["cpu_seconds"][g] for r in runs[side][name]) * 1000 / max(done, 1)
                          for g in ("serve", "postgres", "redis")}
                per[name] = sum(groups.values())
                print(f"{side} {name}: " + ", ".join(f"{g} {v:.4f}" for g, v in groups.items())
                      + f", total {per[name]:.4f} CPU ms per request")
            print(f"{side}: Patient read ÷ /healthz {per['healthz'] / per['patient_read']:.3f}, page "
                  f"{per['healthz'] / per['observation_search']:.3f}")


if __name__ == "__main__":
    main()
