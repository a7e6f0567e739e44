"""The token endpoint in the shape operators run it, beside the embedded one, in one run.

- **production**: `serve --processes 2` on a scratch PostgreSQL database with `SVC_REDIS_URL`
  (a random namespace on the given Redis, removed afterwards);
- **embedded**: `serve --processes 1` on SQLite, no Redis.

Each shape gets `client_credentials` (HTTP Basic, RS256 JWT) and code exchanges (codes minted
through the real endpoints, each used once) from wrk at 32 connections on the same machine, after
a warm-up. CPU is counted for every process that does the work: the serve processes (the master and
its forked children), their PostgreSQL backends and the Redis server. The ratios are against the
one-core RS256 signing ceiling, measured before and after (mean):

- tokens/s ÷ ceiling (target >= 0.9 in the production shape);
- tokens per CPU-second ÷ ceiling (target >= 0.55);
- code exchanges per CPU-second ÷ (ceiling ÷ 2), two signatures each (target >= 0.45).

The two CPU ratios divide by the ceiling in signatures per CPU-second of the signing thread, the
rate by signatures per wall second (equal on an idle machine; see `ratios`).

Balance: BALANCE_ROUNDS rounds of wrk's 32 new keep-alive connections against the production
shape, each serve process's share of the requests per round (from its own metric files), and the
smaller share per round (target >= 0.35 in every round).
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path
from types import MappingProxyType

from bench import loadgen
from bench.cpu_split import cpu_by_library
from bench.fleet import redis_namespace, scratch_database
from bench.peers import OidcPeer, alternating_rounds, peer_unavailable
from bench.remote_db import _proc_cpu, backend_pids, profile_client_credentials
from bench.service import BenchService
from bench.signing import signing_ceiling

CONNECTIONS = 32
SIGNATURES_PER_EXCHANGE = 2
BALANCE_ROUNDS = 6
BALANCE_TARGET = 0.35
PEER_ROUNDS = 4  # ABBA: svc-auth, peer, peer, svc-auth, ...
# svc-auth's tokens per CPU-second ÷ node-oidc-provider's (issue 49): clients in its configuration, then on PostgreSQL.
PEER_IN_CONFIG = "node-oidc-provider (clients in configuration, 1 process)"
PEER_ON_POSTGRES = "node-oidc-provider ({processes} processes, PostgreSQL adapter)"
PEER_TARGETS = (1.1, 1.3)
TARGETS = MappingProxyType({"client_credentials_vs_ceiling": 0.9, "client_credentials_per_cpu_vs_ceiling": 0.55,
                            "authorization_code_per_cpu_vs_ceiling_per_exchange": 0.45})


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (the serve master and the processes it forked)."""
    pids, index = [pid], 0
    while index < len(pids):
        current = pids[index]
        index += 1
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                pids += [int(child) for child in (task / "children").read_text().split()]
            except OSError:
                pass
    return pids


def redis_server_pid(url: str) -> int | None:
    """The Redis server's pid when it runs on this machine (its CPU counts too), else None."""
    import redis
    pid = int(redis.Redis.from_url(url).info("server").get("process_id", 0))
    return pid if pid and Path(f"/proc/{pid}").exists() else None


def requests_per_process(metrics_dir: Path, route: str) -> dict[int, float]:
    """Requests to `route` answered by each serve process (pid), from its own metric files."""
    from prometheus_client.multiprocess import MultiProcessCollector
    counts = {}
    for path in metrics_dir.glob("counter_*.db"):
        pid = int(path.stem.rsplit("_", 1)[1])
        counts[pid] = sum(s.value for metric in MultiProcessCollector.merge([str(path)]) for s in metric.samples
                          if s.name == "svc_http_requests_total" and s.labels.get("route") == route)
    return counts


def established_connections(pid: int, port: int) -> int:
    """TCP connections established to `port` that `pid` holds (its socket inodes in /proc/net/tcp*)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").glob("*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port and fields[9] in inodes:
                count += 1
    return count


def balance_rounds(service: BenchService, seconds: float, say) -> dict:
    """Each serve process's share of `client_credentials` requests in BALANCE_ROUNDS rounds of
    wrk's CONNECTIONS new keep-alive connections (a new wrk each round: new connections)."""
    import threading
    import time
    metrics_dir = service.tmp / "var" / "metrics" / f"serve-{service.port}"
    env = {"BENCH_BODY": "grant_type=client_credentials", "BENCH_AUTHORIZATION": service.client_auth}
    route = "/v1/oauth/token"
    rounds = []
    for number in range(1, BALANCE_ROUNDS + 1):
        pids = process_tree(service.proc.pid)[1:]  # the forked processes
        before = requests_per_process(metrics_dir, route)
        cpu_before = {pid: _proc_cpu(pid) for pid in pids}
        connections: dict[int, int] = {}

        def count_connections(connections=connections, pids=pids):  # halfway through the round: wrk's connections are all open
            time.sleep(seconds / 2)
            connections.update({pid: established_connections(pid, service.port) for pid in pids})

        counter = threading.Thread(target=count_connections)
        counter.start()
        result = loadgen.run(service.url + route, "post", CONNECTIONS, seconds, env=env)
        counter.join()
        cpu = {str(pid): round(_proc_cpu(pid) - cpu_before[pid], 2) for pid in pids}
        answered = result["requests"]  # wrk's completed responses (the server may count a few more, cut off at the end)
        deadline = time.time() + 10  # a request is counted just after its response is written
        while True:
            after = requests_per_process(metrics_dir, route)
            served = {pid: after.get(pid, 0) - before.get(pid, 0) for pid in pids}
            if sum(served.values()) >= answered or time.time() > deadline:
                break
            time.sleep(0.05)
        total = sum(served.values()) or 1
        shares = {str(pid): round(count / total, 3) for pid, count in served.items()}
        smaller = min(shares.values()) if len(shares) > 1 else 0.0
        rounds.append({"round": number, "requests": int(total), "rps": result["rps"], "shares": shares,
                       "smaller_share": smaller, "connections": {str(pid): n for pid, n in connections.items()},
                       "cpu_seconds": cpu})
        say(f"balance round {number}: {int(total)} requests, shares by process "
            f"{' / '.join(f'{v:.3f}' for v in shares.values())}; smaller {smaller:.3f} "
            f"({'meets' if smaller >= BALANCE_TARGET else 'MISSES'} >= {BALANCE_TARGET}); connections "
            f"{' / '.join(str(n) for n in connections.values())}; CPU-s {' / '.join(str(v) for v in cpu.values())}")
    smallest = min(r["smaller_share"] for r in rounds)
    say(f"balance: smallest share over {BALANCE_ROUNDS} rounds {smallest:.3f} (target >= {BALANCE_TARGET} in every round: "
        f"{'meets' if smallest >= BALANCE_TARGET else 'misses'})")
    return {"connections": CONNECTIONS, "seconds": seconds, "rounds": rounds, "smallest_share": smallest,
            "target": BALANCE_TARGET}


class Shape:
    """One running service and the processes whose CPU its requests cost."""

    def __init__(self, name: str, service, admin_url: str | None = None, database: str | None = None,
                 redis_pid: int | None = None):
        """`service`: a BenchService, or any service with `proc`, `url`, `client_auth` and a
        `token_path` (the node-oidc-provider peer, bench/peers.py)."""
        self.name, self.service = name, service
        self.admin_url, self.database, self.redis_pid = admin_url, database, redis_pid
        self.token_path = getattr(service, "token_path", "/v1/oauth/token")

    def cc_env(self) -> dict:
        return {"BENCH_BODY": "grant_type=client_credentials", "BENCH_AUTHORIZATION": self.service.client_auth}

    def pids(self) -> dict[str, list[int]]:
        return {"serve": process_tree(self.service.proc.pid),
                "postgres": backend_pids(self.admin_url, self.database) if self.admin_url else [],
                "redis": [self.redis_pid] if self.redis_pid else []}

    def run(self, lua: str, env: dict, seconds: float) -> dict:
        pids = self.pids()
        before = {pid: _proc_cpu(pid) for group in pids.values() for pid in group}
        result = loadgen.run(self.service.url + self.token_path, lua, CONNECTIONS, seconds, env=env)
        for group, members in self.pids().items():  # a backend or process started during the run counts whole
            pids[group] = sorted(set(pids[group]) | set(members))
        used = {group: round(sum(max(0.0, _proc_cpu(pid) - before.get(pid, 0.0)) for pid in members), 2)
                for group, members in pids.items()}
        ok = result["rps"] * result["seconds"]
        total = sum(used.values())
        result.update({"cpu_seconds": used, "processes": {k: len(v) for k, v in pids.items()},
                       "per_cpu_second": round(ok / max(total, 1e-9), 1)})
        return result

    def tokens(self, codes: list[str], seconds: float, say) -> dict:
        service = self.service
        cc_env = {"BENCH_BODY": "grant_type=client_credentials", "BENCH_AUTHORIZATION": service.client_auth}
        loadgen.run(service.url + "/v1/oauth/token", "post", CONNECTIONS, min(seconds, 2.0), env=cc_env)  # warm-up
        cc = self.run("post", cc_env, seconds)
        codes_file = service.tmp / f"codes-{self.name}.txt"
        codes_file.write_text("\n".join(codes) + "\n")
        exchange = self.run("codes", {"BENCH_CODES_FILE": str(codes_file),
                                      "BENCH_AUTHORIZATION": service.client_auth}, seconds)
        exchange["codes_available"] = len(codes)
        say(f"{self.name}: client_credentials {cc['rps']:.0f}/s ({cc['per_cpu_second']:.0f} per CPU-s, "
            f"p99 {cc['p99_ms']:.2f} ms, errors {cc['errors'] or 'none'}); code exchanges {exchange['rps']:.0f}/s "
            f"({exchange['per_cpu_second']:.0f} per CPU-s, errors {exchange['errors'] or 'none'}); "
            f"CPU s {cc['cpu_seconds']}")
        return {"client_credentials": cc, "authorization_code": exchange}


def ratios(run: dict, ceiling: float, cpu_ceiling: float) -> dict:
    """Rates against the ceiling in signatures per wall second; CPU figures against signatures per
    CPU-second of the signing thread (the same on an idle machine; on a busy one the signing thread
    gets less than a core, and the wall figure would flatter tokens per CPU-second)."""
    cc, exchange = run["client_credentials"], run["authorization_code"]
    return {"client_credentials_vs_ceiling": round(cc["rps"] / ceiling, 3),
            "client_credentials_per_cpu_vs_ceiling": round(cc["per_cpu_second"] / cpu_ceiling, 3),
            "authorization_code_vs_ceiling_per_exchange": round(exchange["rps"] / (ceiling / SIGNATURES_PER_EXCHANGE), 3),
            "authorization_code_per_cpu_vs_ceiling_per_exchange":
                round(exchange["per_cpu_second"] / (cpu_ceiling / SIGNATURES_PER_EXCHANGE), 3)}


def production_benchmarks(postgres_url: str, redis_url: str, seconds: float, say) -> dict:
    per_run = int(3200 * seconds) + 500  # above the exchanges/s either shape reaches here (~1,500-2,100 with httptools)
    namespace = f"svc-bench-{secrets.token_hex(4)}"
    with scratch_database(postgres_url) as db_url, redis_namespace(redis_url, namespace):
        database = db_url.rsplit("/", 1)[1]
        production = BenchService(db_url, processes=2, extra_env={
            "SVC_REDIS_URL": redis_url, "SVC_REDIS_NAMESPACE": namespace})
        embedded = BenchService(None, processes=1)
        try:
            production.start()
            embedded.start()
            shapes = [Shape("production (PostgreSQL + Redis, 2 processes)", production, postgres_url, database,
                            redis_server_pid(redis_url)),
                      Shape("embedded (SQLite, 1 process)", embedded)]
            balance = balance_rounds(production, seconds, say)
            peers = peer_comparison(postgres_url, shapes[0], processes=2, seconds=seconds, say=say)
            codes = {shape.name: shape.service.mint_codes(per_run) for shape in shapes}
            before = signing_ceiling(production.private_key, min(seconds, 3.0))
            say(f"signing ceiling (before): {before['per_second']:.0f} RS256 signatures/s on one core")
            runs = {shape.name: shape.tokens(codes[shape.name], seconds, say) for shape in shapes}
            after = signing_ceiling(production.private_key, min(seconds, 3.0))
            say(f"signing ceiling (after): {after['per_second']:.0f} RS256 signatures/s")
            profile = profile_client_credentials(production, seconds, connections=CONNECTIONS)
            cc_env = {"BENCH_BODY": "grant_type=client_credentials", "BENCH_AUTHORIZATION": production.client_auth}
            cpu_split = cpu_by_library(
                process_tree(production.proc.pid), seconds, production.tmp,
                lambda: loadgen.run(production.url + "/v1/oauth/token", "post", CONNECTIONS, seconds + 1, env=cc_env))
        finally:
            production.stop()
            embedded.stop()
    ceiling = (before["per_second"] + after["per_second"]) / 2
    cpu_ceiling = (before["per_cpu_second"] + after["per_cpu_second"]) / 2
    rows = []
    for shape in shapes:
        row = {"shape": shape.name, **runs[shape.name], "ratios": ratios(runs[shape.name], ceiling, cpu_ceiling)}
        rows.append(row)
        r = row["ratios"]
        say(f"{shape.name}: cc/ceiling {r['client_credentials_vs_ceiling']:.2f}, cc per CPU-s/ceiling "
            f"{r['client_credentials_per_cpu_vs_ceiling']:.2f}, exchanges per CPU-s/(ceiling/2) "
            f"{r['authorization_code_per_cpu_vs_ceiling_per_exchange']:.2f}")
    return {"connections": CONNECTIONS, "signing_ceiling": {"before": before, "after": after,
                                                            "per_second": round(ceiling, 1),
                                                            "per_cpu_second": round(cpu_ceiling, 1)},
            "shapes": rows, "targets": dict(TARGETS), "cores": os.cpu_count(), "profile": profile,
            "cpu_split": cpu_split, "balance": balance, "peers": peers}


def peer_comparison(postgres_url: str, shape: Shape, processes: int, seconds: float, say) -> dict:
    """svc-auth's production `shape` against node-oidc-provider in both of its configurations (issue
    49): as its documentation starts it (the client in its configuration, one process, nothing read
    per token) and on its own scratch PostgreSQL database through its Adapter (`processes` workers);
    PEER_ROUNDS alternating rounds each (bench/peers.py)."""
    unavailable = peer_unavailable()
    if unavailable:
        say(f"node-oidc-provider comparison: skipped ({unavailable})")
        return {"skipped": unavailable}
    with scratch_database(postgres_url) as peer_url:
        in_config, on_postgres = OidcPeer(None), OidcPeer(peer_url, processes=processes)
        try:
            in_config.start()
            on_postgres.start()
            peer_shapes = [Shape(PEER_IN_CONFIG, in_config),
                           Shape(PEER_ON_POSTGRES.format(processes=processes), on_postgres, postgres_url,
                                 peer_url.rsplit("/", 1)[1])]
            result = alternating_rounds([shape, *peer_shapes], PEER_ROUNDS, seconds, say)
        finally:
            in_config.stop()
            on_postgres.stop()
    result["targets"] = {peer.name: target for peer, target in zip(peer_shapes, PEER_TARGETS)}
    result["target"] = PEER_TARGETS[0]
    for peer in peer_shapes:
        got, want = result["per_cpu_second_ratios"][peer.name], result["targets"][peer.name]
        say(f"svc-auth ÷ {peer.name}, tokens per CPU-second: {got:.2f} (target >= {want}: "
            f"{'meets' if got >= want else 'misses'})")
    return result
