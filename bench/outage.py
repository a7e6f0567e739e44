"""Outages under load: PostgreSQL or Redis stopped while `svc-auth serve --processes N` is busy.

`run_outage(...)` drives steady load (one thread per kind of request, keep-alive connections),
stops the dependency for `outage_seconds`, starts it again and keeps the load on. It reports, per
request kind, the statuses seen (500s must be 0; 503s are counted), whether every 503 carried
`Retry-After`, and the recovery time: from the moment the dependency accepted connections again
to the first success of each kind that needs it, and to the last failure after it.
`tests/test_outages.py` asserts on these figures; `python -m bench` reports them.
"""
from __future__ import annotations

import http.client
import json
import threading
import time
from collections import Counter


class Requester(threading.Thread):
    """Sends one kind of request in a loop over a keep-alive connection, recording every answer."""

    def __init__(self, port: int, kind: str, method: str, path: str, headers: dict | None = None,
                 body: bytes | None = None, pause: float = 0.0):
        super().__init__(daemon=True, name=f"load-{kind}")
        self.port, self.kind, self.method, self.path = port, kind, method, path
        self.headers, self.body, self.pause = dict(headers or {}), body, pause
        self.records: list[tuple[float, int, bool, float]] = []  # (time, status, retry_after, seconds)
        self.stopping = threading.Event()

    def run(self):
        conn = None
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=15)
                conn.request(self.method, self.path, body=self.body, headers=self.headers)
                response = conn.getresponse()
                response.read()
                status, retry_after = response.status, response.getheader("Retry-After") is not None
                if response.getheader("Connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException):
                status, retry_after = 0, False  # no answer at all (connection refused or reset)
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.05)
            self.records.append((started, status, retry_after, time.monotonic() - started))
            if self.pause:
                time.sleep(self.pause)
        if conn is not None:
            conn.close()

    def stop(self):
        self.stopping.set()
        self.join(20)


def summarize(requester: Requester, outage_start: float, back_at: float) -> dict:
    statuses = Counter(status for _, status, _, _ in requester.records)
    after = [(t, s) for t, s, _, _ in requester.records if t >= back_at]
    first_ok = next((t for t, s in after if 200 <= s < 300), None)
    last_failure = max((t for t, s in after if not 200 <= s < 300), default=None)
    during = [s for t, s, _, _ in requester.records if outage_start <= t < back_at]
    return {
        "requests": len(requester.records),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "status_500": sum(v for k, v in statuses.items() if k >= 500 and k != 503),
        "status_503": statuses.get(503, 0),
        "no_answer": statuses.get(0, 0),
        "503_without_retry_after": sum(1 for _, s, ra, _ in requester.records if s == 503 and not ra),
        "ok_during_outage": sum(1 for s in during if 200 <= s < 300),
        "first_success_after_s": None if first_ok is None else round(first_ok - back_at, 3),
        "last_failure_after_s": None if last_failure is None else round(last_failure - back_at, 3),
        "p99_ms": _p99([d for _, _, _, d in requester.records]),
    }


def _p99(values):
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 1)


def run_outage(port: int, requesters: list[Requester], stop, start, outage_seconds: float,
               before: float = 1.5, after: float = 6.0, readyz=None) -> dict:
    """Load -> `stop()` -> wait `outage_seconds` -> `start()` (returns once it accepts) -> load `after` s."""
    for r in requesters:
        r.start()
    time.sleep(before)
    ready = {}
    outage_start = time.monotonic()
    stop()
    time.sleep(min(1.0, outage_seconds / 2))
    ready["during"] = _readyz(port)
    time.sleep(max(0.0, outage_seconds - min(1.0, outage_seconds / 2)))
    start()
    back_at = time.monotonic()
    time.sleep(after)
    ready["after"] = _readyz(port)
    for r in requesters:
        r.stop()
    return {"outage_seconds": outage_seconds, "readyz": ready,
            "kinds": {r.kind: summarize(r, outage_start, back_at) for r in requesters}}


def _readyz(port: int) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/readyz")
        response = conn.getresponse()
        body = json.loads(response.read() or b"{}")
        return {"status": response.status,
                "checks": {k: v.get("status") for k, v in body.get("checks", {}).items()}}
    except (OSError, ValueError) as exc:
        return {"status": 0, "error": str(exc)}
    finally:
        conn.close()


# -- shared by tests/test_outages.py and the `outage` benchmark section --------------------------

NO_LIMITS = "organizations=100000000/60,activation_status=100000000/60"


def seed(settings) -> dict:
    """Schema, a clinic, an application installed there (already initialized: `Disabled`)."""
    from lifecycle.applications import install_application, register_application
    from lifecycle.organizations import create_organization
    from models.application import Installation
    from runtime import Runtime
    runtime = Runtime(settings)
    try:
        runtime.migrate()
        org = create_organization("Outage Clinic", "sandbox", "https://ehr.example/outage")
        app, secret = register_application(runtime, "Outage App", "https://app.example.com/main",
                                           "https://app.example.com/launch")
        installation = install_application(app.id, org.id)
        Installation.update(activation_status="Disabled").where(Installation.id == installation.id).execute()
        return {"app_id": app.id, "client_id": app.client_id, "secret": secret, "org_id": org.id}
    finally:
        runtime.close()


def basic(seeded: dict) -> str:
    import base64
    return "Basic " + base64.b64encode(f"{seeded['client_id']}:{seeded['secret']}".encode()).decode()


def client_token(port: int, seeded: dict) -> str:
    import urllib.request
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/oauth/token", method="POST",
                                     data=b"grant_type=client_credentials",
                                     headers={"Authorization": basic(seeded),
                                              "Content-Type": "application/x-www-form-urlencoded"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())["access_token"]


def load_for(port: int, seeded: dict, token: str) -> list[Requester]:
    """Two kinds that need the database (a partner API listing, a client_credentials token) and
    two that must not (`/healthz`, the JWKS)."""
    return [
        Requester(port, "organizations", "GET", f"/v1/applications/{seeded['app_id']}/organizations",
                  {"Authorization": f"Bearer {token}"}),
        Requester(port, "token", "POST", "/v1/oauth/token",
                  {"Authorization": basic(seeded), "Content-Type": "application/x-www-form-urlencoded"},
                  b"grant_type=client_credentials"),
        Requester(port, "healthz", "GET", "/healthz", pause=0.01),
        Requester(port, "jwks", "GET", "/.well-known/jwks.json", pause=0.01),
    ]


def probe_while_locked(port: int, seeded: dict, token: str, database_url: str, table: str,
                       lock_seconds: float) -> dict:
    """Hold a PostgreSQL table lock for `lock_seconds` while one request waits on it, and time
    `/healthz` and the JWKS (keep-alive, back to back) meanwhile."""
    import psycopg2
    waited: dict = {}

    def waiter():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        started = time.monotonic()
        conn.request("PUT", f"/v1/applications/{seeded['app_id']}/organizations/{seeded['org_id']}/activation-status",
                     body=json.dumps({"status": "Disabled"}),
                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        waited.update(status=response.status, seconds=round(time.monotonic() - started, 2))
        conn.close()

    lock = psycopg2.connect(database_url)
    lock.cursor().execute(f'LOCK TABLE "{table}" IN ACCESS EXCLUSIVE MODE')
    thread = threading.Thread(target=waiter, daemon=True)
    locked_at = time.monotonic()
    thread.start()
    time.sleep(0.2)
    latencies = {"healthz": [], "jwks": []}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    i = 0
    while time.monotonic() - locked_at < lock_seconds:
        kind = "healthz" if i % 2 == 0 else "jwks"
        started = time.monotonic()
        conn.request("GET", "/healthz" if kind == "healthz" else "/.well-known/jwks.json")
        response = conn.getresponse()
        response.read()
        latencies[kind].append(time.monotonic() - started)
        i += 1
    conn.close()
    still_waiting = thread.is_alive()
    lock.rollback()
    lock.close()
    thread.join(30)
    return {"lock_seconds": lock_seconds, "waiting_request": {**waited, "still_waiting_at_unlock": still_waiting},
            **{kind: {"requests": len(v), "p50_ms": _pct(v, 0.50), "p99_ms": _pct(v, 0.99),
                      "max_ms": round(max(v) * 1000, 2) if v else None} for kind, v in latencies.items()}}


def _pct(values, q):
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000, 2)


def outage_benchmarks(say, outage_seconds: float = 10.0, lock_seconds: float = 3.0) -> dict:
    """The two issue-11 figures, against `serve --processes 2` on a PostgreSQL of our own."""
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from bench.instances import LocalPostgres, free_port
    from conf import Settings

    root = Path(__file__).resolve().parent.parent
    pg = LocalPostgres()
    tmp = Path(tempfile.mkdtemp(prefix="svc-bench-outage-"))
    proc = None
    try:
        pg.start()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SVC_")}
        env.update({"SVC_DATABASE_URL": pg.url, "SVC_VAR_DIR": str(tmp / "var"), "SVC_KEYS_DIR": str(tmp / "keys"),
                    "SVC_HMAC_KEY": "b" * 32, "SVC_RATE_LIMITS": NO_LIMITS, "SVC_LOG_LEVEL": "WARNING"})
        seeded = seed(Settings.from_env(env, dotenv=None))
        port = free_port()
        env["SVC_ISSUER"] = f"http://127.0.0.1:{port}"
        log = open(tmp / "serve.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "cli.__main__", "serve", "--port", str(port), "--processes",
                                 "2"], env=env, cwd=str(root), stdout=log, stderr=subprocess.STDOUT)
        _wait_for(port)
        token = client_token(port, seeded)
        say(f"outage: /healthz and JWKS while a request waits {lock_seconds:.0f} s on a PostgreSQL table lock")
        locked = probe_while_locked(port, seeded, token, pg.url, "installation", lock_seconds)
        say(f"outage: PostgreSQL stopped for {outage_seconds:.0f} s under load (serve --processes 2)")
        outage = run_outage(port, load_for(port, seeded, token), pg.stop, pg.start, outage_seconds, before=2.0,
                            after=8.0)
        return {"locked_database": locked, "postgresql_outage": outage}
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        pg.destroy()


def _wait_for(port: int, timeout: float = 30.0) -> None:
    import socket
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"serve did not listen on {port}")
