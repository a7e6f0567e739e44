"""`client_credentials` in the production shape: this checkout against a baseline commit, alternating.

`python -m bench.token_ab --baseline REV [--rounds 6] [--seconds 4]`: both `serve --processes 2`
up for the whole run, each on its own scratch PostgreSQL database and Redis namespace (the baseline
from its own tree, `bench.floor.baseline_tree`), wrk at 32 connections against one and then the
other in ABBA order. CPU per token counts every process that does the work: the serve processes,
their PostgreSQL backends and the Redis server (shared: it counts for whichever runs). Prints
the CPU ms per token and the tokens per CPU-second of each, summed over the rounds, and the ratio.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import secrets

from bench import loadgen
from bench.fleet import DEFAULT_POSTGRES_URL, redis_namespace, scratch_database
from bench.floor import baseline_tree
from bench.production import process_tree, redis_server_pid
from bench.remote_db import _proc_cpu, backend_pids
from bench.service import BenchService

CONNECTIONS = 32


def _cpu(service: BenchService, admin_url: str, database: str, redis_pid: int | None) -> float:
    pids = process_tree(service.proc.pid) + backend_pids(admin_url, database) + ([redis_pid] if redis_pid else [])
    return sum(_proc_cpu(pid) for pid in pids)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.token_ab")
    parser.add_argument("--baseline", required=True)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--postgres-url", default=os.environ.get("BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL))
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()}", flush=True)
    with contextlib.ExitStack() as stack:
        tree, commit = stack.enter_context(baseline_tree(args.baseline))
        services = {}
        for name, root in (("this", None), (f"baseline {commit[:7]}", tree)):
            url = stack.enter_context(scratch_database(args.postgres_url))
            namespace = stack.enter_context(redis_namespace(args.redis_url, f"svc-bench-{secrets.token_hex(4)}"))
            extra = {"SVC_REDIS_URL": args.redis_url, "SVC_REDIS_NAMESPACE": namespace}
            service = BenchService(url, processes=2, extra_env=extra, **({"root": root} if root else {}))
            stack.callback(service.stop)
            service.start()
            services[name] = (service, url.rsplit("/", 1)[1])
        redis_pid = redis_server_pid(args.redis_url)
        env = {name: {"BENCH_BODY": "grant_type=client_credentials", "BENCH_AUTHORIZATION": s.client_auth}
               for name, (s, _) in services.items()}
        for name, (service, _) in services.items():  # warm-up, not counted
            loadgen.run(service.url + "/v1/oauth/token", "post", CONNECTIONS, 2.0, env=env[name])
        totals = {name: [0.0, 0.0] for name in services}
        names = list(services)
        for number in range(args.rounds):
            for name in (names if number % 2 == 0 else names[::-1]):
                service, database = services[name]
                before = _cpu(service, args.postgres_url, database, redis_pid)
                run = loadgen.run(service.url + "/v1/oauth/token", "post", CONNECTIONS, args.seconds, env=env[name])
                cpu = _cpu(service, args.postgres_url, database, redis_pid) - before
                done = run["rps"] * run["seconds"]
                totals[name][0] += done
                totals[name][1] += cpu
                print(f"round {number + 1}, {name}: {run['rps']:.0f}/s, {1000 * cpu / max(done, 1):.4f} CPU ms per token, "
                      f"errors {run['errors'] or 'none'}", flush=True)
    for name, (done, cpu) in totals.items():
        print(f"{name}: {1000 * cpu / max(done, 1):.4f} CPU ms per token, {done / max(cpu, 1e-9):.0f} per CPU-second")
    (a_done, a_cpu), (b_done, b_cpu) = totals[names[0]], totals[names[1]]
    print(f"this ÷ baseline per CPU-second: {(a_done / a_cpu) / (b_done / b_cpu):.3f}; load average {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
