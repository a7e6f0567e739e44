"""`python -m bench.read_floor`: the least an audited FHIR read can cost in this stack (issue 49
item 3, issue 46 item 7), against what `/healthz` costs, in the production shape's database.

Not svc-auth: a skeleton of one process with the same HTTP layer as `serve` (Tornado's
Application on `ops.httpconn`'s llhttp connection), answering two paths:

- `GET /healthz`: `{"status": "ok"}`, as svc-auth's (less its access line and metrics);
- `GET /read`: only what a read cannot do without: the bearer token checked (an HMAC compared in
  constant time, as cheap as a gate can be: no lookup, no revocation check, no limiter), a Patient
  taken from a dict and written as FHIR JSON with orjson, and a disclosure record made durable
  before the answer: a row inserted into PostgreSQL by one writer thread that commits whatever
  has queued meanwhile (a group commit; no hash chain), the request awaiting its commit.

`--no-record` answers the read without the record; `--versions` adds one shared version read per
batch of requests (what svc-auth's revocation check costs at best); `--pool` runs the gate and the
JSON in a job of svc-auth's own `runtime.pool.BlockingPool` (8 threads), as `answer` runs: the
hop's cost; `--proxied` takes the Patient from an EHR stand-in first (nginx answering its JSON,
its CPU not counted, as issue 46 item 7 leaves the EHR's out) through svc-auth's own EHR client on
the IOLoop (`connectors.fhir.aio`), and writes it again with orjson: the least a proxied read adds.
wrk drives each path at 16 connections for `--seconds`, `--rounds` times alternating; CPU per
request is the skeleton's process (every thread) plus its PostgreSQL backend, from /proc. The ratio the issues set is
read ÷ `/healthz` per request: at most 2.5 (0.4 of `/healthz` per CPU-second).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import os
import socket
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

from bench import loadgen
from bench.fleet import DEFAULT_POSTGRES_URL, scratch_database
from bench.remote_db import _proc_cpu, backend_pids
from bench.service import free_port

KEY = b"k" * 32
PATIENT_JSON = ('{"resourceType":"Patient","id":"p1","gender":"female","birthDate":"1980-01-01",'
                '"meta":{"versionId":"1","lastUpdated":"2026-11-30T00:00:00Z"},'
                '"name":[{"family":"Example","given":["Ana"]}],"identifier":[{"system":"urn:oid:1.2.3","value":"12345"}]}')


def token() -> str:
    payload = "app1.user1.p1.jti1"
    return f"{payload}.{hmac.new(KEY, payload.encode(), hashlib.sha256).hexdigest()}"


class GroupCommit:
    """One writer thread: inserts every record queued since its last commit, commits, resolves."""

    def __init__(self, db_url: str, loop, versions: bool):
        import psycopg2
        self.conn = psycopg2.connect(db_url)
        with self.conn, self.conn.cursor() as cur:
            cur.execute("CREATE TABLE IF NOT EXISTS floor_record (id bigserial PRIMARY KEY, app text, "
                        "usr text, jti text, patient text, at double precision)")
            cur.execute("CREATE TABLE IF NOT EXISTS floor_version (topic text PRIMARY KEY, version bigint)")
            cur.execute("INSERT INTO floor_version VALUES ('denied', 0) ON CONFLICT DO NOTHING")
        self.loop, self.versions = loop, versions
        self.pending: list = []
        self.ready = threading.Condition()
        threading.Thread(target=self._run, daemon=True).start()

    def record(self, row: tuple) -> asyncio.Future:
        future = self.loop.create_future()
        with self.ready:
            self.pending.append((row, future))
            self.ready.notify()
        return future

    def _run(self) -> None:
        cur = self.conn.cursor()
        while True:
            with self.ready:
                while not self.pending:
                    self.ready.wait()
                batch, self.pending = self.pending, []
            if self.versions:
                cur.execute("SELECT topic, version FROM floor_version")
                cur.fetchall()
            args = b",".join(cur.mogrify("(%s,%s,%s,%s,%s)", row) for row, _ in batch)
            cur.execute(b"INSERT INTO floor_record (app, usr, jti, patient, at) VALUES " + args)
            self.conn.commit()
            self.loop.call_soon_threadsafe(_resolve, [future for _, future in batch])


def _resolve(futures) -> None:
    for future in futures:
        if not future.done():
            future.set_result(None)


class Upstream:
    """The EHR stand-in at `url`, through svc-auth's own EHR client (`connectors.fhir.aio`: kept-alive
    connections, the answer parsed by llhttp, a deadline per exchange)."""

    def __init__(self, url: str):
        from connectors.fhir.aio import AsyncConnections, request_head
        parts = urlsplit(url)
        self.origin = (parts.scheme, parts.hostname, parts.port)
        self.request = request_head("GET", "/Patient/p1", self.origin, {"Accept": "application/fhir+json"}, None)
        self.connections = AsyncConnections(per_origin=64)  # every read in flight keeps its connection

    async def patient(self) -> bytes:
        connection, _ = await self.connections.take(self.origin, 5.0)
        _, _, body = await connection.exchange(self.request, 10.0, lambda status, head: 1 << 20)
        self.connections.give_back(self.origin, connection, connection.reusable)
        return body


def serve(port: int, db_url: str, record: bool, versions: bool, in_pool: bool, upstream_url: str | None) -> None:
    import orjson
    import tornado.web

    from ops.httpconn import HttptoolsConnection, HttptoolsServer
    from runtime.pool import BlockingPool

    class Slot:
        def opened(self):
            pass

        def closed(self):
            pass

    patients = {"p1": orjson.loads(PATIENT_JSON)}

    async def main():
        loop = asyncio.get_running_loop()
        writer = GroupCommit(db_url, loop, versions) if record else None
        pool = BlockingPool(8, "floor") if in_pool else None
        upstream = Upstream(upstream_url) if upstream_url else None

        class Health(tornado.web.RequestHandler):
            async def get(self):
                self.set_header("Cache-Control", "no-store")
                self.set_header("Content-Type", "application/json")
                self.finish(b'{"status":"ok"}')

        def checked(authorization: str):
            """The bearer's (app, user, patient, jti) and the Patient's JSON, or None."""
            payload, _, signature = authorization[7:].rpartition(".")
            expected = hmac.new(KEY, payload.encode(), hashlib.sha256).hexdigest()
            if not hmac.compare_digest(signature, expected):
                return None
            app, user, patient, jti = payload.split(".")
            return (app, user, patient, jti), orjson.dumps(patients[patient])

        class Read(tornado.web.RequestHandler):
            async def get(self):
                authorization = self.request.headers.get("Authorization", "")
                answer = await pool.run_soon(loop, checked, authorization) if pool else checked(authorization)
                if answer is None:
                    raise tornado.web.HTTPError(401)
                (app, user, patient, jti), body = answer
                if upstream is not None:
                    body = orjson.dumps(orjson.loads(await upstream.patient()))
                if writer is not None:
                    await writer.record((app, user, jti, patient, time.time()))
                self.set_header("Cache-Control", "no-store")
                self.set_header("Content-Type", "application/fhir+json; charset=UTF-8")
                self.finish(body)

        app = tornado.web.Application([(r"/healthz", Health), (r"/read", Read)], log_function=lambda handler: None)
        server = HttptoolsServer(app, Slot())
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(256)
        await loop.create_server(lambda: HttptoolsConnection(server), sock=sock)
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


def _measure(url: str, pids, seconds: float, authorization: str | None) -> tuple[float, float, float]:
    """(CPU ms per request of every pid, of the pids after the first (PostgreSQL), requests/s)."""
    before = [_proc_cpu(pid) for pid in pids]
    run = loadgen.run(url, "get", 16, seconds, env={"BENCH_AUTHORIZATION": authorization or ""})
    cpu = [_proc_cpu(pid) - was for pid, was in zip(pids, before)]
    if run["errors"]:
        raise RuntimeError(f"errors at {url}: {run['errors']}")
    return sum(cpu) * 1000 / run["requests"], sum(cpu[1:]) * 1000 / run["requests"], run["rps"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument("--versions", action="store_true")
    parser.add_argument("--pool", action="store_true")
    parser.add_argument("--proxied", action="store_true")
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    parser.add_argument("--postgres-url", default=os.environ.get("BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL))
    parser.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(int(args.serve[0]), args.serve[1], not args.no_record, args.versions, args.pool, args.upstream)
        return
    with contextlib.ExitStack() as stack:
        db_url = stack.enter_context(scratch_database(args.postgres_url))
        upstream = stack.enter_context(loadgen.fixed_server(PATIENT_JSON, "application/fhir+json")) if args.proxied else None
        port = free_port()
        child = subprocess.Popen([sys.executable, "-m", "bench.read_floor", "--serve", str(port), db_url,
                                  *(["--no-record"] if args.no_record else []), *(["--versions"] if args.versions else []),
                                  *(["--pool"] if args.pool else []), *(["--upstream", upstream] if upstream else [])],
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline().strip() == "ready"
            pids = [child.pid, *backend_pids(args.postgres_url, db_url.rsplit("/", 1)[1])]
            base = f"http://127.0.0.1:{port}"
            _measure(f"{base}/read", pids, 2, f"Bearer {token()}")  # warm-up
            totals = {"healthz": [], "read": []}
            for number in range(args.rounds):
                order = ("healthz", "read") if number % 2 == 0 else ("read", "healthz")
                for name in order:
                    ms, database_ms, rps = _measure(f"{base}/{name}", pids, args.seconds,
                                                    f"Bearer {token()}" if name == "read" else None)
                    totals[name].append((ms, database_ms))
                    print(f"round {number + 1} {name}: {rps:.0f}/s, {ms:.4f} CPU ms per request "
                          f"(PostgreSQL {database_ms:.4f})", flush=True)
            healthz, read = (sum(ms for ms, _ in totals[n]) / len(totals[n]) for n in ("healthz", "read"))
            database = sum(ms for _, ms in totals["read"]) / len(totals["read"])
            print(f"healthz {healthz:.4f} ms, read {read:.4f} ms (PostgreSQL {database:.4f}): read ÷ healthz "
                  f"{read / healthz:.2f}× ({healthz / read:.2f} of /healthz per CPU-second); load {os.getloadavg()[0]:.2f}")
        finally:
            child.terminate()
            child.wait()


if __name__ == "__main__":
    main()
