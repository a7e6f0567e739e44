"""A loopback TCP proxy that delays what the server sends back: a database one round trip away.

`python -m bench.delayproxy --listen PORT --target HOST:PORT --delay-ms 1.0` forwards every
connection to the target and holds each chunk the target sends for `delay-ms` before passing it on
(in order), so each request/response exchange takes that much longer: the round trip to a database
in another rack or zone. The whole delay sits on the way back because asyncio sleeps with the
kernel's millisecond resolution; half a millisecond each way would round up to a millisecond each
way. The bench measures the round trip it really adds (`measure_added_rtt`).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


async def _pipe(reader, writer, delay: float) -> None:
    loop = asyncio.get_running_loop()
    queue: collections.deque = collections.deque()
    wake = asyncio.Event()
    done = False

    async def drain():
        while True:
            while not queue:
                if done:
                    return
                wake.clear()
                await wake.wait()
            due, data = queue[0]
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            queue.popleft()
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(drain())
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            queue.append((loop.time() + delay, data))
            wake.set()
    finally:
        done = True
        wake.set()
        try:
            await sender
        finally:
            writer.close()


async def _serve(listen_port: int, target_host: str, target_port: int, delay: float) -> None:
    async def handle(client_reader, client_writer):
        sock = client_writer.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            server_reader, server_writer = await asyncio.open_connection(target_host, target_port)
        except OSError:
            client_writer.close()
            return
        server_writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(_pipe(client_reader, server_writer, 0.0), _pipe(server_reader, client_writer, delay),
                             return_exceptions=True)

    server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


class DelayProxy:
    """Runs the proxy in its own process (its CPU is not the service's); `url_for(db_url)` rewrites a
    PostgreSQL URL to go through it."""

    def __init__(self, target_host: str, target_port: int, delay_ms: float):
        self.target_host, self.target_port, self.delay_ms = target_host, target_port, delay_ms
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = None

    def start(self) -> "DelayProxy":
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.delayproxy", "--listen", str(self.port),
                                      "--target", f"{self.target_host}:{self.target_port}",
                                      "--delay-ms", str(self.delay_ms)], cwd=str(ROOT))
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the delay proxy did not start")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def cpu_seconds(self) -> float:
        fields = open(f"/proc/{self.proc.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def median_query_ms(url: str, count: int = 300) -> float:
    """Median time of `SELECT 1` round trips on one connection to `url`."""
    import psycopg2
    conn = psycopg2.connect(url)
    conn.autocommit = True
    cursor = conn.cursor()
    times = []
    for _ in range(count):
        started = time.perf_counter()
        cursor.execute("SELECT 1")
        cursor.fetchone()
        times.append((time.perf_counter() - started) * 1000)
    conn.close()
    return statistics.median(times)


def measure_added_rtt(direct_url: str, proxied_url: str) -> dict:
    direct, proxied = median_query_ms(direct_url), median_query_ms(proxied_url)
    return {"direct_ms": round(direct, 3), "proxied_ms": round(proxied, 3), "added_ms": round(proxied - direct, 3)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.delayproxy")
    parser.add_argument("--listen", type=int, required=True)
    parser.add_argument("--target", required=True, help="HOST:PORT")
    parser.add_argument("--delay-ms", type=float, default=1.0)
    args = parser.parse_args(argv)
    host, _, port = args.target.rpartition(":")
    asyncio.run(_serve(args.listen, host, int(port), args.delay_ms / 1000))
    return 0


if __name__ == "__main__":
    sys.exit(main())
