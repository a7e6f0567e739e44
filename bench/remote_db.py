"""Token throughput with PostgreSQL one round trip away, and tokens per CPU-second.

One run, one scratch database, one `serve` process:
1. loopback: `client_credentials` and code exchanges against PostgreSQL directly;
2. remote: the same through `bench.delayproxy` (about 1 ms more round trip, measured);
3. the ratios remote / loopback (target >= 0.8), and `client_credentials` tokens per CPU-second of
   the serve process plus its PostgreSQL backends as a fraction of the one-core RS256 signing
   ceiling (target >= 0.5);
4. a cProfile of the serve process under `client_credentials` load, summarised (where the CPU goes).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from bench import loadgen
from bench.delayproxy import DelayProxy, measure_added_rtt
from bench.fleet import scratch_database
from bench.service import BenchService
from bench.signing import signing_ceiling

CONNECTIONS = 16
TARGET_REMOTE_RATIO = 0.8
TARGET_CPU_RATIO = 0.5


def _proc_cpu(pid: int) -> float:
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def backend_pids(admin_url: str, database: str) -> list[int]:
    import psycopg2
    conn = psycopg2.connect(admin_url)
    try:
        cursor = conn.cursor()
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", (database,))
        return [row[0] for row in cursor.fetchall()]
    finally:
        conn.close()


def with_url_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{port}"
    return urlunsplit((parts.scheme, f"{netloc[0]}@{host}" if len(netloc) == 2 else host, parts.path,
                       parts.query, parts.fragment))


class Measured:
    """CPU of the serve process and of its PostgreSQL backends around a load run."""

    def __init__(self, service: BenchService, admin_url: str, database: str):
        self.service, self.admin_url, self.database = service, admin_url, database

    def run(self, lua: str, env: dict, seconds: float) -> dict:
        pids = backend_pids(self.admin_url, self.database)
        serve_before = self.service.cpu_seconds()
        pg_before = {pid: _proc_cpu(pid) for pid in pids}
        result = loadgen.run(self.service.url + "/v1/oauth/token", lua, CONNECTIONS, seconds, env=env)
        serve = self.service.cpu_seconds() - serve_before
        pg = sum(max(0.0, _proc_cpu(pid) - before) for pid, before in pg_before.items())
        ok = result["rps"] * result["seconds"]
        result.update({"serve_cpu_seconds": round(serve, 2), "postgres_cpu_seconds": round(pg, 2),
                       "postgres_backends": len(pids),
                       "per_cpu_second": round(ok / max(serve + pg, 1e-9), 1)})
        return result


def token_runs(service: BenchService, measured: Measured, codes: list[str], seconds: float, say, label: str) -> dict:
    cc_env = {"BENCH_BODY": "grant_type=client_credentials", "BENCH_AUTHORIZATION": service.client_auth}
    loadgen.run(service.url + "/v1/oauth/token", "post", CONNECTIONS, min(seconds, 2.0), env=cc_env)  # warm-up
    cc = measured.run("post", cc_env, seconds)
    codes_file = service.tmp / f"codes-{label}.txt"
    codes_file.write_text("\n".join(codes) + "\n")
    exchange = measured.run("codes", {"BENCH_CODES_FILE": str(codes_file), "BENCH_AUTHORIZATION": service.client_auth},
                            seconds)
    exchange["codes_available"] = len(codes)
    say(f"{label}: client_credentials {cc['rps']:.0f}/s (p99 {cc['p99_ms']:.2f} ms, errors {cc['errors'] or 'none'}), "
        f"code exchanges {exchange['rps']:.0f}/s (p99 {exchange['p99_ms']:.2f} ms, errors "
        f"{exchange['errors'] or 'none'})")
    return {"client_credentials": cc, "authorization_code": exchange}


PY_SPY = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))

# Inclusive shares reported from the profile: (label, substring of a py-spy frame "name (file:line)").
PROFILE_PARTS = (
    ("TokenService.sign (JWS: header/claims JSON, base64url, RSA)", "sign (oauth/tokens.py"),
    ("RSA signature itself (cryptography)", "rsa_signature (oauth/tokens.py"),
    ("token_response (grant, client authentication, signing)", "token_response (oauth/token_endpoint.py"),
    ("authenticate_client (cached app, HMAC of the secret)", "authenticate_client (oauth/clients.py"),
    ("Tornado HTTP/1.1 parsing and writing", "tornado/http1connection.py"),
    ("socket writes (IOStream.write_to_fd: the send syscall)", "write_to_fd (tornado/iostream.py"),
    ("access log and request metrics (log_request)", "log_request (ops/observability.py"),
)


def profile_client_credentials(service: BenchService, seconds: float, top: int = 12, connections: int = CONNECTIONS) -> dict:
    """Sample the serve process and the processes it forked with py-spy (every thread) during
    `client_credentials` load: the functions with the most own samples, and the inclusive share of
    the parts above."""
    if not Path(PY_SPY).exists():
        return {"skipped": "py-spy is not installed (make bench-deps)"}
    out = service.tmp / "profile.txt"
    env = {"BENCH_BODY": "grant_type=client_credentials", "BENCH_AUTHORIZATION": service.client_auth}
    loadgen.run(service.url + "/v1/oauth/token", "post", connections, min(seconds, 2.0), env=env)  # warm-up
    spy = subprocess.Popen([PY_SPY, "record", "--pid", str(service.proc.pid), "--subprocesses",
                            "--duration", str(int(seconds)),
                            "--rate", "200", "--format", "raw", "--output", str(out), "--nonblocking"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    run = loadgen.run(service.url + "/v1/oauth/token", "post", connections, seconds + 1, env=env)
    _, err = spy.communicate(timeout=seconds + 60)
    if spy.returncode != 0 or not out.exists():
        return {"skipped": f"py-spy failed: {err.decode(errors='replace').strip()[:300]}"}
    own: dict[str, int] = {}
    parts = {label: 0 for label, _ in PROFILE_PARTS}
    total = 0
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        if "wait (threading.py" in frames[-1]:
            continue  # a thread parked on a condition (pool, change poll): idle, not CPU
        total += n
        leaf = frames[-1]
        own[leaf] = own.get(leaf, 0) + n
        for label, needle in PROFILE_PARTS:
            if any(needle in frame for frame in frames):
                parts[label] += n
    top_own = sorted(own.items(), key=lambda item: item[1], reverse=True)[:top]
    return {"tool": "py-spy record --subprocesses --rate 200 (all threads, busy samples only)", "samples": total,
            "profiled_rps": run["rps"],
            "inclusive_share": {label: round(n / max(total, 1), 3) for label, n in parts.items()},
            "top_own": [{"frame": frame, "share": round(n / max(total, 1), 3)} for frame, n in top_own]}


def combine(blocks: list[dict]) -> dict:
    """Two measurements of the same thing as one: requests and CPU summed, the worse p99."""
    out = {}
    for kind in ("client_credentials", "authorization_code"):
        runs = [block[kind] for block in blocks]
        requests = sum(r["rps"] * r["seconds"] for r in runs)
        seconds = sum(r["seconds"] for r in runs)
        serve = sum(r["serve_cpu_seconds"] for r in runs)
        pg = sum(r["postgres_cpu_seconds"] for r in runs)
        out[kind] = {"runs": runs, "rps": round(requests / seconds, 1), "seconds": round(seconds, 2),
                     "p50_ms": max(r["p50_ms"] for r in runs), "p99_ms": max(r["p99_ms"] for r in runs),
                     "serve_cpu_seconds": round(serve, 2), "postgres_cpu_seconds": round(pg, 2),
                     "per_cpu_second": round(requests / max(serve + pg, 1e-9), 1),
                     "errors": [r["errors"] for r in runs if r["errors"]]}
    return out


def remote_database_benchmarks(postgres_url: str, seconds: float, say, delay_ms: float = 1.0) -> dict:
    with scratch_database(postgres_url) as db_url:
        database = urlsplit(db_url).path.lstrip("/")
        target = urlsplit(db_url)
        proxy = DelayProxy(target.hostname or "127.0.0.1", target.port or 5432, delay_ms).start()
        proxied_url = with_url_port(db_url, proxy.port)
        service = BenchService(db_url)
        remote_service = None
        try:
            rtt = measure_added_rtt(db_url, proxied_url)
            say(f"delay proxy: SELECT 1 median {rtt['direct_ms']} ms direct, {rtt['proxied_ms']} ms through the "
                f"proxy: +{rtt['added_ms']} ms round trip")
            service.start()
            ceiling = signing_ceiling(service.private_key, seconds)
            say(f"signing ceiling: {ceiling['per_cpu_second']:.0f} RS256 signatures per CPU-second "
                f"({ceiling['per_second']:.0f}/s of wall time on a shared machine)")
            # The same seeded data served a second time, through the proxy.
            remote_service = BenchService(proxied_url, extra_env={"SVC_HMAC_KEY": service.env["SVC_HMAC_KEY"]})
            for name in ("client_id", "secret", "redirect_uri", "application_id", "sandbox_token", "private_key"):
                setattr(remote_service, name, getattr(service, name))
            remote_service.start_seeded()
            per_run = int(600 * seconds) + 300  # above the exchanges/s one process reaches here
            codes = service.mint_codes(4 * per_run)
            targets = {"loopback": Measured(service, postgres_url, database),
                       "remote": Measured(remote_service, postgres_url, database)}
            runs: dict = {"loopback": [], "remote": []}
            # A B B A: the machine is shared, so drift during the run falls on both sides alike.
            for i, which in enumerate(("loopback", "remote", "remote", "loopback")):
                label = "loopback" if which == "loopback" else f"PostgreSQL +{rtt['added_ms']} ms"
                runs[which].append(token_runs(targets[which].service, targets[which],
                                              codes[i * per_run:(i + 1) * per_run], seconds, say, label))
            loopback, remote = combine(runs["loopback"]), combine(runs["remote"])
            remote_service.stop_process()
            profile = profile_client_credentials(service, seconds)
        finally:
            service.stop()
            if remote_service is not None:
                remote_service.stop()
            proxy.stop()
    cc_ratio = remote["client_credentials"]["rps"] / loopback["client_credentials"]["rps"]
    ex_ratio = remote["authorization_code"]["rps"] / loopback["authorization_code"]["rps"]
    cpu_ratio = loopback["client_credentials"]["per_cpu_second"] / ceiling["per_cpu_second"]
    say(f"remote / loopback: client_credentials {cc_ratio:.2f}, code exchange {ex_ratio:.2f} "
        f"(target >= {TARGET_REMOTE_RATIO})")
    say(f"client_credentials tokens per CPU-second (serve + PostgreSQL backends) / signing ceiling: {cpu_ratio:.2f} "
        f"(target >= {TARGET_CPU_RATIO})")
    return {"delay_proxy": {"delay_ms": delay_ms, **rtt}, "signing_ceiling": ceiling, "connections": CONNECTIONS,
            "loopback": loopback, "remote": remote, "profile": profile,
            "ratios": {"client_credentials_remote_vs_loopback": round(cc_ratio, 3),
                       "authorization_code_remote_vs_loopback": round(ex_ratio, 3),
                       "client_credentials_per_cpu_second_vs_ceiling": round(cpu_ratio, 3),
                       "target_remote": TARGET_REMOTE_RATIO, "target_cpu": TARGET_CPU_RATIO}}


if __name__ == "__main__":
    import json
    from bench.fleet import DEFAULT_POSTGRES_URL
    url = os.environ.get("BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    print(json.dumps(remote_database_benchmarks(url, float(sys.argv[1]) if len(sys.argv) > 1 else 5.0,
                                                lambda text: print(text, flush=True)), indent=2))
