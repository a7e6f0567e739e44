"""Throwaway PostgreSQL and Redis servers of our own, for outage tests and benchmarks.

They are started on free ports under a fresh directory and may be stopped and started again at
will: nothing else uses them (the shared PostgreSQL and Redis are never touched).
"""
from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time


PORT_BLOCKS = (12000, 32000, 4000)
"""Where `free_port` finds ports: from 12000 up to the kernel's ephemeral range (32768 on Linux),
one block of 4000 for each pytest-xdist worker."""


def _port_block() -> range:
    """This process's block: its xdist worker's (`gw2` -> the third), else the first."""
    start, end, size = PORT_BLOCKS
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[:2] == "gw" and worker[2:].isdigit() else 0
    first = start + (index * size) % (end - start)
    return range(first, first + size)


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now, for a server a test or bench starts.

    Not one the kernel picks for `bind(0)`: a port found that way is released before the server
    binds it, and the kernel may give it meanwhile to another process (a parallel test worker's
    server, whose answers the test then read: a clean-clone CI run saw nginx's 400 from another
    test's nginx). Below the ephemeral range the kernel hands out no port by itself, and each
    xdist worker has a block of its own (`PORT_BLOCKS`), searched from a random place in it."""
    import random
    block = _port_block()
    first = random.randrange(len(block))
    for offset in range(len(block)):
        port = block[(first + offset) % len(block)]
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use (a server of an earlier test, another service): the next one
            return port
    raise RuntimeError(f"no free port in {block}")


def _pg_bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)),
                                       None)
    if not found:
        raise RuntimeError(f"{name} not found (install PostgreSQL's server binaries)")
    return found


class LocalPostgres:
    """`initdb` + `pg_ctl` on a free port; `stop()` / `start()` as often as needed; `destroy()` at the end."""

    def __init__(self):
        # PostgreSQL refuses to run as root: as root, the cluster belongs to the `postgres` user.
        self.as_postgres = os.geteuid() == 0
        self.dir = tempfile.mkdtemp(prefix="svc-pg-", dir="/tmp")
        self.data = os.path.join(self.dir, "data")
        self.port = free_port()
        if self.as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run(_pg_bin("initdb"), "-D", self.data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args, check=True):
        command = ["runuser", "-u", "postgres", "--", *args] if self.as_postgres else list(args)
        return subprocess.run(command, check=check, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)

    def start(self) -> float:
        """Start the server and wait until it accepts connections; returns the seconds it took."""
        started = time.monotonic()
        self._run(_pg_bin("pg_ctl"), "-D", self.data, "-l", os.path.join(self.dir, "server.log"), "-w", "start",
                  "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                        f"-c max_connections=100")
        return time.monotonic() - started

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (`fast`: disconnects every client at once, as a restart or failover does)."""
        self._run(_pg_bin("pg_ctl"), "-D", self.data, "-m", mode, "-w", "stop", check=False)

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


class LocalRedis:
    """`redis-server --port N` without persistence; `stop()` / `start()` again; `destroy()` at the end."""

    def __init__(self):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = None
        self.dir = tempfile.mkdtemp(prefix="svc-redis-")

    def start(self) -> float:
        started = time.monotonic()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return time.monotonic() - started
            except OSError:
                time.sleep(0.02)
        raise TimeoutError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
