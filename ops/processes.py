"""`serve --processes N`: fork N workers sharing the listening socket, and supervise them.

Unlike `tornado.process.fork_processes`, the parent forwards SIGTERM/SIGINT to its children (so a
plain `kill <parent>` drains every worker gracefully, not only systemd's cgroup-wide signal) and
restarts a worker that crashes while the service is not stopping. On SIGTERM the parent also
closes its own copy of the listening sockets at once: the kernel keeps accepting connections
into a listening socket while any process still holds it, and the parent never answers them.
"""
from __future__ import annotations

import logging
import os
import signal
import sys

from ops import metrics

log = logging.getLogger("svc_auth.processes")

MAX_RESTARTS = 100


def fork_workers(count: int, sockets=()) -> int:
    """Return a worker index (0..count-1) in each forked worker; the parent never returns.

    `sockets`: the listening sockets the workers share; the parent closes its copies on SIGTERM."""
    children: dict[int, int] = {}
    stopping = False
    restarts = 0

    def start(index: int) -> bool:
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            return True
        children[pid] = index
        return False

    for index in range(count):
        if start(index):
            return index

    def forward(signum, frame):
        nonlocal stopping
        stopping = True
        for sock in sockets:
            sock.close()  # no restart will need them; new connections are refused once workers close theirs
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
                return index
    sys.exit(status_code)
