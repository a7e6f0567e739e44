"""node-oidc-provider beside svc-auth: `client_credentials` tokens per CPU-second, alternating rounds.

The peer is `bench/js/oidc_peer.mjs` (npm `oidc-provider` 9 and `pg`, pinned in bench/js's
package-lock.json): node-oidc-provider on a PostgreSQL database of its own through its Adapter
interface, the client registered in that database, client_secret_basic, RS256-signed JWT access
tokens, as many worker processes as svc-auth's production shape. Both services are up for the
whole run; wrk drives one, then the other (svc-auth, peer, peer, svc-auth, ...), so the machine's
drift falls on both alike. CPU counted per round: every process of the service (primary and
workers) plus its PostgreSQL backends (and, for svc-auth, the Redis server).
"""
from __future__ import annotations

import secrets
import shutil
import subprocess
import threading
from pathlib import Path

from bench.service import basic, free_port

JS = Path(__file__).resolve().parent / "js"
NODE = shutil.which("node")


def peer_unavailable() -> str | None:
    """Why the peer cannot run here (no node, or bench/js's packages not installed), else None."""
    if NODE is None:
        return "node is not installed"
    if not (JS / "node_modules" / "oidc-provider").exists():
        return "bench/js's packages are not installed (make bench installs them: npm ci in bench/js)"
    return None


class OidcPeer:
    """node-oidc-provider (`bench/js/oidc_peer.mjs`) on `database_url`, `processes` workers; with
    `database_url` None, as its documentation starts it: the client in its configuration, its
    in-memory adapter, one process (issue 49)."""

    token_path = "/token"

    def __init__(self, database_url: str | None, processes: int = 2):
        self.database_url = database_url
        self.processes = processes if database_url else 1
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.client_id, self.secret = "bench-peer", secrets.token_urlsafe(24)
        self.proc = None
        self.output = None

    @property
    def client_auth(self) -> str:
        return basic(self.client_id, self.secret)

    def start(self) -> "OidcPeer":
        """Start the peer and wait (60 s at most) for its `ready` line. Its output is drained by a
        thread for as long as it runs: a blocking `readline` here could wait past any deadline on a
        peer that hangs silently, and an unread pipe stalls Node (its writes to a pipe block) once
        `server_error` lines fill it."""
        storage = ["--database-url", self.database_url] if self.database_url else ["--clients-in-config"]
        self.proc = subprocess.Popen(
            [NODE, str(JS / "oidc_peer.mjs"), "--port", str(self.port), *storage,
             "--client-id", self.client_id, "--client-secret", self.secret, "--processes", str(self.processes)],
            cwd=str(JS), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.output, ready, ended = [], threading.Event(), threading.Event()

        def drain(stream=self.proc.stdout):
            for line in stream:
                if len(self.output) < 200:
                    self.output.append(line)
                if line.startswith("ready "):
                    ready.set()
            ended.set()
            ready.set()  # woken: start() sees it ended

        threading.Thread(target=drain, name="oidc-peer-output", daemon=True).start()
        if not ready.wait(60):
            self.stop()
            raise TimeoutError("oidc_peer.mjs did not start within 60 s: " + "".join(self.output))
        if ended.is_set():
            raise RuntimeError("oidc_peer.mjs exited: " + "".join(self.output))
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def alternating_rounds(shapes: list, rounds: int, seconds: float, say) -> dict:
    """`client_credentials` from wrk against each shape in turn, `rounds` each, ABBA order; every
    shape warmed up first. Returns per-shape rounds and medians, and the ratio of the first shape's
    tokens per CPU-second to each other's (sums of tokens over sums of CPU; `per_cpu_second_ratio`:
    to the second's)."""
    for shape in shapes:
        # Warm-up, not counted: a full round each (node's JIT, the first run of 20261126T170231Z.json
        # at 2 s gave the peer 900 tokens per CPU-s against 1,600-1,900 in its later rounds).
        shape.run("post", shape.cc_env(), seconds)
    results = {shape.name: [] for shape in shapes}
    for number in range(rounds):
        order = shapes if number % 2 == 0 else shapes[::-1]
        for shape in order:
            run = shape.run("post", shape.cc_env(), seconds)
            results[shape.name].append(run)
            say(f"round {number + 1}, {shape.name}: {run['rps']:.0f} tokens/s, {run['per_cpu_second']:.0f} per CPU-s "
                f"(CPU s {run['cpu_seconds']}), p99 {run['p99_ms']:.2f} ms, errors {run['errors'] or 'none'}")
    summary = {}
    for shape in shapes:
        runs = results[shape.name]
        tokens = sum(r["rps"] * r["seconds"] for r in runs)
        cpu = sum(sum(r["cpu_seconds"].values()) for r in runs)
        rates = sorted(r["rps"] for r in runs)
        p99s = sorted(r["p99_ms"] for r in runs)
        summary[shape.name] = {"rounds": runs, "tokens_per_second_median": rates[len(rates) // 2],
                               "p99_ms_median": p99s[len(p99s) // 2],
                               "per_cpu_second": round(tokens / max(cpu, 1e-9), 1),
                               "min_round_rps": rates[0]}
    first = summary[shapes[0].name]["per_cpu_second"]
    ratios = {s.name: round(first / max(summary[s.name]["per_cpu_second"], 1e-9), 3) for s in shapes[1:]}
    return {"rounds": rounds, "seconds": seconds, "order": "ABBA", "shapes": summary,
            "names": [s.name for s in shapes], "per_cpu_second_ratios": ratios,
            "per_cpu_second_ratio": ratios[shapes[1].name]}
