"""`serve --processes N`: fork N workers, each listening on a socket of its own, and supervise them.

Each worker has its own listening socket on the same port (SO_REUSEPORT), so the kernel spreads
new connections over the workers by a hash of each connection's addresses and ports; one shared
socket let whichever worker woke first take a whole burst, and keep-alive kept it there. The
parent binds the first workers' sockets before forking (a port that cannot be bound is one line,
before any fork), gives each worker its own and closes every one of its copies: the kernel keeps
accepting connections into a listening socket while any process holds it, and the parent never
answers them. A worker restarted after a crash binds a socket of its own again.

Unlike `tornado.process.fork_processes`, the parent forwards SIGTERM/SIGINT to its children (so a
plain `kill <parent>` drains every worker gracefully, not only systemd's cgroup-wide signal) and
restarts a worker that crashes while the service is not stopping.
"""
from __future__ import annotations

import logging
import os
import signal
import sys

from ops import metrics

log = logging.getLogger("svc_auth.processes")

MAX_RESTARTS = 100


def fork_workers(count: int, listen) -> tuple[int, list]:
    """Return (worker index 0..count-1, its listening sockets) in each forked worker; the parent
    never returns.

    `listen()` binds and returns a new set of listening sockets (SO_REUSEPORT) and raises when it
    cannot: the parent calls it once per worker before forking, a restarted worker after its fork."""
    children: dict[int, int] = {}
    stopping = False
    restarts = 0
    first = [listen() for _ in range(count)]

    def start(index: int) -> bool:
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            return True
        children[pid] = index
        return False

    def own_sockets(index: int) -> list:
        """In a worker: the sockets bound for it before the first fork (closing its copies of the
        others'), or, for a restarted worker, new ones."""
        for other, sockets in enumerate(first):
            if other != index:
                for sock in sockets:
                    sock.close()
        return first[index] if first[index] and first[index][0].fileno() != -1 else listen()

    for index in range(count):
        if start(index):
            return index, own_sockets(index)
    for sockets in first:  # each worker holds its own; the parent holds no listening socket
        for sock in sockets:
            sock.close()

    def forward(signum, frame):
        nonlocal stopping
        stopping = True
        for pid in list(children):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    status_code = 0
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        index = children.pop(pid, None)
        if index is None:
            continue
        metrics.mark_process_dead(pid)
        failed = os.WIFSIGNALED(status) or os.waitstatus_to_exitcode(status) != 0
        if failed and not stopping:
            if restarts >= MAX_RESTARTS:
                log.error("worker %d (pid %d) died; too many restarts, giving up", index, pid)
                status_code = 1
                continue
            restarts += 1
            log.warning("worker %d (pid %d) died with status %d; restarting", index, pid, status)
            if start(index):
                return index, own_sockets(index)
    sys.exit(status_code)
