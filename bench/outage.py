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
