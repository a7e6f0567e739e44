"""The HL7v2 SIU feed's listener (`svc-auth hl7 listen`): acknowledgments per second, and a backfill's memory.

Each shape (PostgreSQL: a scratch database; embedded: SQLite in a temp dir) gets a clinic on the
feed and a real listener process. 8 senders (asyncio, one MLLP connection each, a message at a
time: send, wait for the ACK, as an interface engine does) send distinct SIU^S12s for `seconds`;
every ACK must be `AA`, each one sent after its message committed. The same senders then drive an
empty MLLP echo (`python -m bench.hl7_feed echo PORT`: the same event loop and framing, a fixed
ACK, no parsing and no database) for the same time: the listener's figure is given as a ratio to
it. The backfill sends `backfill` messages (100,000: a large clinic's first load) through the
same senders on PostgreSQL and samples the listener's resident memory along the way; flat means
the last sample is within a few MB of the one at 10%.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SENDERS = 8
FACILITY = "BENCH_CLINIC"
ECHO_ACK = b"\x0bMSH|^~\\&|SVC-AUTH||||20300101000000||ACK^S12^ACK|1|P|2.5.1\rMSA|AA|1\r\x1c\x0d"


def message(n: int, sender: int) -> bytes:
    control = f"B{sender}-{n}"
    day = 1 + n % 28
    xcn = "1234567893^TOR^DOC^^^^^^NPI&2.16.840.1.113883.4.6&ISO^^^^NPI"
    text = "\r".join([
        f"MSH|^~\\&|EPIC|{FACILITY}|SVCAUTH|HUB|20300101{n % 24:02d}0000||SIU^S12^SIU_S12|{control}|P|2.5.1",
        f"SCH||K{control}||||ROUTINE|FOLLOWUP^Follow-up|OFFICE VISIT|20|MIN|^^^203003{day:02d}093000^203003{day:02d}095000"
        "||||||||||||||Booked",
        f"PID|||MRN{n}^^^EPI^MR||DOE^JANE||19800101|F",
        f"PV1||O|IM^^^CLINIC||||{xcn}",
        "RGS|1", "AIS|1||1001^OFFICE VISIT", "AIL|1||IM^^^CLINIC",
        f"AIP|1||{xcn}|1^MD||203003{day:02d}093000|0|MIN|20|MIN",
    ])
    return b"\x0b" + text.encode() + b"\x1c\x0d"


async def _sender(port: int, sender: int, deadline: float | None, count: int | None, start: int, progress: list) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    done = 0
    try:
        while (deadline is None or time.monotonic() < deadline) and (count is None or done < count):
            writer.write(message(start + done, sender))
            reply = await reader.readuntil(b"\x1c\x0d")
            if b"MSA|AA|" not in reply:
                raise RuntimeError(f"not acknowledged AA: {reply[:200]!r}")
            done += 1
            progress[0] += 1
    finally:
        writer.close()
    return done


def send(port: int, seconds: float | None = None, total: int | None = None, start: int = 0, on_progress=None) -> dict:
    """8 senders for `seconds`, or until `total` messages; returns {"acks", "seconds", "per_second"}."""
    async def run():
        progress = [0]
        deadline = time.monotonic() + seconds if seconds else None
        each = None if total is None else -(-total // SENDERS)
        tasks = [asyncio.create_task(_sender(port, i, deadline, each, start, progress)) for i in range(SENDERS)]
        began = time.monotonic()
        if on_progress:
            while not all(t.done() for t in tasks):
                await asyncio.sleep(0.5)
                on_progress(progress[0])
        counts = await asyncio.gather(*tasks)
        elapsed = time.monotonic() - began
        return {"acks": sum(counts), "seconds": round(elapsed, 2), "per_second": round(sum(counts) / elapsed)}
    return asyncio.run(run())


def echo(port: int) -> None:
    """The empty MLLP echo: a fixed ACK for each framed message (the same loop and deframer as the listener)."""
    import uvloop
    from hl7feed.mllp import Deframer

    async def handle(reader, writer):
        deframer = Deframer()
        while data := await reader.read(65536):
            for _ in deframer.feed(data):
                writer.write(ECHO_ACK)
            await writer.drain()
        writer.close()

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", port)
        print("ready", flush=True)
        async with server:
            await server.serve_forever()
    uvloop.run(main())


def _svc(env: dict, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "cli.__main__", *args], env=env, cwd=str(ROOT), capture_output=True,
                          text=True, timeout=300)
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    return done.stdout


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


@contextlib.contextmanager
def _process(args: list[str], env: dict, port: int):
    proc = subprocess.Popen(args, env=env, cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_port(port, proc)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_port(port: int, proc, timeout: float = 60) -> None:
    import socket
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {port}")


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _shape(database_url: str, var_dir: str, seconds: float, say, backfill: int = 0) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SVC_")}
    env.update(SVC_DATABASE_URL=database_url, SVC_HMAC_KEY="b" * 64, SVC_VAR_DIR=var_dir, SVC_LOG_LEVEL="WARNING")
    json.loads(_svc(env, "orgs", "create", "--name", "Bench Clinic", "--schedule-source", "siu",
                          "--hl7-facility", FACILITY, "--json"))["id"]
    port = _free_port()
    result: dict = {}
    with _process([sys.executable, "-m", "cli.__main__", "hl7", "listen", "--host", "127.0.0.1", "--port", str(port)],
                  env, port) as listener:
        send(port, seconds=min(seconds, 2.0), start=10_000_000)  # warm-up, not measured
        result["listener"] = send(port, seconds=seconds)
        if backfill:
            samples = []

            def sample(done: int) -> None:
                if not samples or done >= samples[-1][0] + backfill // 10:
                    samples.append((done, _rss_mb(listener.pid)))
            began_rss = _rss_mb(listener.pid)
            run = send(port, total=backfill, start=20_000_000, on_progress=sample)
            samples.append((run["acks"], _rss_mb(listener.pid)))
            at_tenth = next((rss for done, rss in samples if done >= backfill // 10), samples[0][1])
            result["backfill"] = {**run, "rss_mb_start": began_rss, "rss_mb_at_10pct": at_tenth,
                                  "rss_mb_end": samples[-1][1], "rss_mb_samples": samples}
            say(f"  backfill of {run['acks']:,}: {run['per_second']}/s, listener RSS {began_rss} MB at start, "
                f"{at_tenth} MB at 10%, {samples[-1][1]} MB at the end")
    echo_port = _free_port()
    with _process([sys.executable, "-m", "bench.hl7_feed", "echo", str(echo_port)], env, echo_port):
        send(echo_port, seconds=min(seconds, 2.0))
        result["echo"] = send(echo_port, seconds=seconds)
    result["ratio"] = round(result["listener"]["per_second"] / max(1, result["echo"]["per_second"]), 3)
    return result


def hl7_feed_benchmarks(postgres_url: str | None, seconds: float, say, backfill: int = 100_000) -> dict:
    """Both shapes (PostgreSQL skipped, with the reason, when `postgres_url` is None)."""
    from bench.fleet import scratch_database
    report: dict = {"senders": SENDERS}
    with tempfile.TemporaryDirectory() as var:
        report["embedded"] = _shape(f"sqlite:///{var}/bench.db", var, seconds, say)
        say(f"hl7 feed, embedded: {report['embedded']['listener']['per_second']} ACKs/s, "
            f"{report['embedded']['ratio']} of an empty MLLP echo ({report['embedded']['echo']['per_second']}/s)")
    if postgres_url:
        with tempfile.TemporaryDirectory() as var, scratch_database(postgres_url) as url:
            report["postgresql"] = _shape(url, var, seconds, say, backfill)
        say(f"hl7 feed, PostgreSQL: {report['postgresql']['listener']['per_second']} ACKs/s, "
            f"{report['postgresql']['ratio']} of an empty MLLP echo ({report['postgresql']['echo']['per_second']}/s)")
    return report


def render(section: dict) -> list[str]:
    rows = [f"**HL7 SIU feed** (`svc-auth hl7 listen`, {section.get('senders', SENDERS)} senders, each message "
            f"committed before its AA; {section.get('started_at', '')}):", "",
            "| shape | ACKs/s | empty MLLP echo/s | ratio |", "|---|---|---|---|"]
    for shape in ("postgresql", "embedded"):
        s = section.get(shape)
        if s:
            rows.append(f"| {shape} | {s['listener']['per_second']:,} | {s['echo']['per_second']:,} | {s['ratio']} |")
    backfill = (section.get("postgresql") or {}).get("backfill")
    if backfill:
        rows += ["", f"Backfill of {backfill['acks']:,} messages on PostgreSQL: {backfill['seconds']} s "
                     f"({backfill['per_second']:,}/s); listener RSS {backfill['rss_mb_at_10pct']} MB at 10%, "
                     f"{backfill['rss_mb_end']} MB at the end."]
    if section.get("postgresql_skipped"):
        rows += ["", f"PostgreSQL: skipped ({section['postgresql_skipped']})."]
    return rows + [""]


if __name__ == "__main__":
    if sys.argv[1:2] == ["echo"]:
        echo(int(sys.argv[2]))
