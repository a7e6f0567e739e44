"""`serve --processes N`: fork N workers sharing one listening socket, balance them, supervise them.

The parent binds the listening socket before forking (a port that cannot be bound is one line,
before any fork) and creates the shared array of open connections per worker
(`ops.balance.ConnectionCounts`); every worker accepts from the one shared socket, one connection
at a time and only while it does not hold more connections than the others + 1
(`ops.balance.BalancedAcceptor`), so new connections go to the worker with the fewest, in every
burst. (A socket per worker with `SO_REUSEPORT` spreads them by a random hash instead: of 32
connections, the smaller share was below 35% in 11% of bursts; one shared socket with Tornado's
accept loop gave a whole burst to whichever worker woke first.)

Unlike `tornado.process.fork_processes`, the parent forwards SIGTERM/SIGINT to its children (so a
plain `kill <parent>` drains every worker gracefully, not only systemd's cgroup-wide signal) and
restarts a worker that crashes while the service is not stopping; the restarted worker accepts
from the same socket, its slot reset. The parent never accepts. It keeps its copy of the socket
for the restarts, and closes it at once on SIGTERM: the kernel keeps accepting connections into a
listening socket while any process holds it, and the parent never answers them.
"""
from __future__ import annotations

import logging
import os
import signal
import sys

from ops import metrics
from ops.balance import ABSENT, ConnectionCounts, Slot

log = logging.getLogger("svc_auth.processes")

MAX_RESTARTS = 100


class Supervisor:
    """Forks `count` workers on the shared listening `sockets` and supervises them; owns the
    shared array of their open connections."""

    def __init__(self, count: int, sockets: list):
        self.count, self.sockets = count, list(sockets)
        self.counts = ConnectionCounts(count)  # before the first fork: shared by every worker
        self.children: dict[int, int] = {}
        self.stopping = False
        self.restarts = 0
        self.gave_up = False

    def run(self) -> Slot:
        """In each forked worker: return its slot (`slot.index` is 0..count-1). The parent never
        returns: it exits when every worker has."""
        for index in range(self.count):
            if self.start(index):
                return Slot(self.counts, index)
        signal.signal(signal.SIGTERM, self.forward)
        signal.signal(signal.SIGINT, self.forward)
        while self.children:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            index = self.children.pop(pid, None)
            if index is None:
                continue
            self.counts.set(index, ABSENT)  # the others stop comparing themselves with it
            metrics.mark_process_dead(pid)
            failed = os.WIFSIGNALED(status) or os.waitstatus_to_exitcode(status) != 0
            if failed and not self.stopping:
                if self.restarts >= MAX_RESTARTS:
                    log.error("worker %d (pid %d) died; too many restarts, giving up", index, pid)
                    self.gave_up = True
                    continue
                self.restarts += 1
                log.warning("worker %d (pid %d) died with status %d; restarting", index, pid, status)
                if self.start(index):
                    return Slot(self.counts, index)
        sys.exit(1 if self.gave_up else 0)

    def start(self, index: int) -> bool:
        self.counts.set(index, ABSENT)  # until the new worker accepts
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            return True
        self.children[pid] = index
        return False

    def forward(self, signum, frame) -> None:
        self.stopping = True
        for sock in self.sockets:
            sock.close()  # no restart will need it; new connections are refused once the workers close theirs
        for pid in list(self.children):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
