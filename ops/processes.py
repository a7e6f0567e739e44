"""`serve --processes N`: fork N workers sharing one listening socket, balance them, supervise them.

The parent binds the listening socket before forking (a port that cannot be bound is one line,
before any fork) and creates the shared array of open connections per worker
(`ops.balance.ConnectionCounts`); every worker accepts from the one shared socket, one connection
at a time and only while it does not hold more connections than the others + 1
(`ops.balance.BalancedAcceptor`), so new connections go to the worker with the fewest, in every
burst. (A socket per worker with `SO_REUSEPORT` spreads them by a random hash instead: of 32
connections, the smaller share was below 35% in 11% of bursts; one shared socket with Tornado's
accept loop gave a whole burst to whichever worker woke first.)

The parent never accepts; it supervises (like gunicorn's arbiter), and logs everything it does:
- Heartbeats: each worker writes the monotonic clock (`CLOCK_MONOTONIC`, one clock for every
  process) into its slot of a shared array from its event loop (`Pulse`); its first beat says it
  is serving. A worker whose beat is older than `heartbeat_timeout` (stopped, or its loop stuck),
  or that does not beat within BOOT_SECONDS of its fork, is killed with SIGKILL and replaced.
- Restarts: a worker that exits while the service is not stopping is replaced after an
  exponential backoff per slot (BACKOFF_BASE doubling up to `backoff_max`; back to the base once
  a worker served STABLE_SECONDS), and at most `restart_budget` restarts per rolling minute: past
  the budget a restart waits for the minute to free a place. It never gives up.
- Startup failure: a worker of the first generation that exits before it ever served (a setting
  or resource only a worker meets) stops the whole server: the others are stopped and `serve`
  exits non-zero with one line (`StartupError`). A replacement that fails before serving is a crash
  like any other (a dependency may be down for a while).
- Stop: SIGTERM/SIGINT/SIGHUP (installed before the first fork, so no signal finds the parent
  without them) are forwarded to every worker as SIGTERM (a plain `kill <parent>` drains them
  gracefully, not only systemd's cgroup-wide signal); the parent closes its copy of the socket at
  once (the kernel keeps accepting into a listening socket while any process holds it, and the
  parent never answers), cancels pending restarts, and SIGKILLs whatever has not exited
  `drain_timeout` + KILL_GRACE_SECONDS later, so the parent always exits (1 if it had to kill).
- The parent gone (SIGKILL, a crash): its workers drain and exit. Each asks the kernel for SIGTERM
  when its parent dies (`PR_SET_PDEATHSIG`, Linux), and its heartbeat checks `getppid()` too (any
  system), so no worker keeps serving orphaned, with no supervisor to replace or stop it.
"""
from __future__ import annotations

import asyncio
import collections
import ctypes
import fcntl
import logging
import multiprocessing
import os
import select
import signal
import sys
import time
from dataclasses import dataclass

from ops import metrics
from ops.balance import ABSENT, ConnectionCounts, Slot
from ops.startup import StartupError

log = logging.getLogger("svc_auth.processes")

BACKOFF_BASE = 0.1
"""Seconds before the first restart of a slot; doubled for each further consecutive failure."""
STABLE_SECONDS = 60.0
"""A worker that served this long resets its slot's backoff."""
BOOT_SECONDS = 60.0
"""A worker that has not beaten this long after its fork is killed (it hangs at start)."""
KILL_GRACE_SECONDS = 5.0
"""After the workers' drain timeout, this long to close connections and exit before SIGKILL."""
BUDGET_WINDOW_SECONDS = 60.0
TICK_SECONDS = 0.25
"""The supervisor looks at its workers' heartbeats at least this often (a signal wakes it at once)."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""Each makes the supervisor stop its workers as SIGTERM does (HUP: the terminal or session went away)."""
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@dataclass(frozen=True)
class SupervisorPolicy:
    """The supervisor's limits (`svc-auth serve` options)."""
    restart_budget: int = 30  # restarts per rolling minute, over all workers
    backoff_max: float = 10.0  # seconds; the longest wait before a restart
    heartbeat_timeout: float = 30.0  # seconds without a beat before a worker is replaced
    drain_timeout: float = 25.0  # seconds a worker lets requests in flight finish after SIGTERM

    @property
    def beat_interval(self) -> float:
        return max(0.05, min(1.0, self.heartbeat_timeout / 5))


class Heartbeats:
    """The shared array of each worker's last beat (`time.monotonic()`), 0 until its first beat."""

    def __init__(self, processes: int):
        self.times = multiprocessing.RawArray("d", processes)


class Pulse:
    """One worker's heartbeat: `start()` on its running loop once it serves. A beat that finds
    the supervisor (`parent`) gone sends this worker SIGTERM: it drains and exits."""

    def __init__(self, heartbeats: Heartbeats, index: int, interval: float, parent: int | None = None):
        self.heartbeats, self.index, self.interval, self.parent = heartbeats, index, interval, parent

    def start(self) -> None:
        loop = asyncio.get_running_loop()

        def beat() -> None:
            self.heartbeats.times[self.index] = time.monotonic()
            if self.parent is not None and os.getppid() != self.parent:
                log.error("worker %d (pid %d): the supervisor (pid %d) is gone; stopping", self.index,
                          os.getpid(), self.parent)
                self.parent = None
                os.kill(os.getpid(), signal.SIGTERM)
            loop.call_later(self.interval, beat)

        beat()


@dataclass
class Worker:
    """What a forked worker gets: its balancing slot and its heartbeat."""
    slot: Slot
    pulse: Pulse


@dataclass
class _Child:
    index: int
    forked_at: float
    ready_at: float | None = None
    killed: str = ""


class Supervisor:
    """Forks `count` workers on the shared listening `sockets` and supervises them."""

    def __init__(self, count: int, sockets: list, policy: SupervisorPolicy | None = None):
        self.count, self.sockets = count, list(sockets)
        self.policy = policy or SupervisorPolicy()
        self.pid = os.getpid()  # the supervisor's, as its workers know it
        self.counts = ConnectionCounts(count)  # before the first fork: shared by every worker
        self.heartbeats = Heartbeats(count)
        self.children: dict[int, _Child] = {}
        self.served = [False] * count  # has a worker of this slot ever served?
        self.failures = [0] * count  # consecutive failures per slot (the backoff's exponent)
        self.due: dict[int, float] = {}  # slot -> when its replacement is forked
        self.restarts: collections.deque[float] = collections.deque()  # fork times within the budget window
        self.stopping = False
        self.kill_at: float | None = None
        self.killed_at_stop = False
        self.startup_failure = ""
        self.signalled = 0
        self.wakeup_r = self.wakeup_w = -1

    def run(self) -> Worker:
        """In each forked worker: return its `Worker`. The parent never returns: it exits when
        every worker has (0, or 1 if it had to kill one at stop), or raises `StartupError`."""
        self.wakeup_r, self.wakeup_w = os.pipe()
        for fd in (self.wakeup_r, self.wakeup_w):
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        # Before the first fork: a signal at any moment from here on stops the workers forked so far
        # (a SIGHUP used to kill the parent alone, at its default action, leaving them orphaned).
        signal.set_wakeup_fd(self.wakeup_w)  # a signal wakes the select below at once
        for sig in STOP_SIGNALS:
            signal.signal(sig, self.on_stop)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        for index in range(self.count):
            if self.signalled:
                break  # the loop below stops those already forked
            if self.fork(index):
                return self.worker(index)
        log.info("supervisor %d: %d workers, restart budget %d/min, heartbeat timeout %.1fs, drain timeout %.1fs",
                 os.getpid(), self.count, self.policy.restart_budget, self.policy.heartbeat_timeout,
                 self.policy.drain_timeout)
        while self.children or (self.due and not self.stopping):
            self.sleep()
            now = time.monotonic()
            if self.signalled and not self.stopping:
                log.info("supervisor %d: %s received", os.getpid(), signal.Signals(self.signalled).name)
                self.stop()
            self.reap(now)
            if self.stopping:
                self.kill_the_undrained(now)
                continue
            self.watch_heartbeats(now)
            for index, when in sorted(self.due.items()):
                if when <= now:
                    del self.due[index]
                    self.restarts.append(now)
                    if self.fork(index):
                        return self.worker(index)
        signal.set_wakeup_fd(-1)
        if self.startup_failure:
            raise StartupError(self.startup_failure)
        log.info("supervisor %d: every worker has exited", os.getpid())
        raise SystemExit(1 if self.killed_at_stop else 0)

    # --- the loop's steps -------------------------------------------------------------------

    def sleep(self) -> None:
        """Until a signal arrives or the next check is due."""
        timeout = min(TICK_SECONDS, self.policy.beat_interval)
        if self.due and not self.stopping:
            timeout = max(0.0, min(timeout, min(self.due.values()) - time.monotonic()))
        try:
            select.select([self.wakeup_r], [], [], timeout)
            while os.read(self.wakeup_r, 512):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def reap(self, now: float) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self.children.pop(pid, None)
            if child is not None:
                self.exited(pid, child, status, now)

    def exited(self, pid: int, child: _Child, status: int, now: float) -> None:
        index = child.index
        self.counts.set(index, ABSENT)  # the others stop comparing themselves with it
        metrics.mark_process_dead(pid)
        how = describe(status)
        if self.stopping:
            log.info("worker %d (pid %d) %s", index, pid, how)
            return
        if child.ready_at is None and self.heartbeats.times[index] > 0:
            child.ready_at = now  # it beat after the last look
            self.served[index] = True
        if child.ready_at is None and not self.served[index] and not child.killed:
            self.startup_failure = (f"worker {index} (pid {pid}) {how} before it served (failed at startup; "
                                    f"see its error above); stopping the server")
            log.error("%s", self.startup_failure)
            self.stop()
            return
        if child.ready_at is not None and now - child.ready_at >= STABLE_SECONDS:
            self.failures[index] = 0
        self.failures[index] += 1
        delay = min(self.policy.backoff_max, BACKOFF_BASE * 2 ** (self.failures[index] - 1))
        reason = f"{how} ({child.killed})" if child.killed else how
        when = now + delay
        self.forget_old_restarts(now)
        if len(self.restarts) + len(self.due) >= self.policy.restart_budget:
            earliest = sorted([*self.restarts, *self.due.values()])[-self.policy.restart_budget]
            when = max(when, earliest + BUDGET_WINDOW_SECONDS)
            log.error("worker %d (pid %d) %s; restart budget of %d per minute spent, restarting in %.2fs",
                      index, pid, reason, self.policy.restart_budget, when - now)
        else:
            log.warning("worker %d (pid %d) %s; restarting in %.2fs", index, pid, reason, when - now)
        self.due[index] = when

    def forget_old_restarts(self, now: float) -> None:
        while self.restarts and self.restarts[0] <= now - BUDGET_WINDOW_SECONDS:
            self.restarts.popleft()

    def watch_heartbeats(self, now: float) -> None:
        """SIGKILL a worker that stopped beating (or never started); `exited` replaces it."""
        for pid, child in list(self.children.items()):
            if child.killed:
                continue
            beat = self.heartbeats.times[child.index]
            if beat == 0:
                if now - child.forked_at > BOOT_SECONDS:
                    self.kill(pid, child, f"killed: did not start serving within {BOOT_SECONDS:.0f}s")
                continue
            if child.ready_at is None:
                child.ready_at = now
                self.served[child.index] = True
                log.info("worker %d (pid %d) serving", child.index, pid)
            if now - beat > self.policy.heartbeat_timeout:
                self.kill(pid, child, f"killed: no heartbeat for {now - beat:.1f}s")

    def kill(self, pid: int, child: _Child, reason: str) -> None:
        log.error("worker %d (pid %d) %s; sending SIGKILL", child.index, pid, reason.removeprefix("killed: "))
        child.killed = reason
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def kill_the_undrained(self, now: float) -> None:
        if self.kill_at is None or now < self.kill_at:
            return
        for pid, child in list(self.children.items()):
            if not child.killed:
                self.killed_at_stop = True
                self.kill(pid, child, f"killed: still running {self.policy.drain_timeout + KILL_GRACE_SECONDS:.1f}s "
                                      f"after SIGTERM")

    # --- forking and stopping ---------------------------------------------------------------

    def fork(self, index: int) -> bool:
        """Fork the worker of slot `index`; True in the child."""
        self.counts.set(index, ABSENT)  # until the new worker accepts
        self.heartbeats.times[index] = 0.0
        # Blocked across the fork: a signal meant for the child before it restored the default
        # actions would otherwise run the parent's handler in the child, and be lost.
        handled = {*STOP_SIGNALS, signal.SIGCHLD}
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, handled)
        try:
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                for sig in handled:
                    signal.signal(sig, signal.SIG_DFL)
                os.close(self.wakeup_r)
                os.close(self.wakeup_w)
                exit_with_parent(self.pid)
                return True
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        self.children[pid] = _Child(index, time.monotonic())
        log.info("worker %d started (pid %d)", index, pid)
        return False

    def worker(self, index: int) -> Worker:
        return Worker(Slot(self.counts, index, self.heartbeats.times, self.policy.beat_interval),
                      Pulse(self.heartbeats, index, self.policy.beat_interval, parent=self.pid))

    def on_stop(self, signum, frame) -> None:
        self.signalled = signum  # the loop wakes (wakeup fd) and stops; nothing else in a handler

    def stop(self) -> None:
        """Close the socket, cancel restarts, SIGTERM every worker; SIGKILL them after the drain."""
        self.stopping = True
        self.due.clear()
        for sock in self.sockets:
            sock.close()  # no restart will need it; new connections are refused once the workers close theirs
        self.kill_at = time.monotonic() + self.policy.drain_timeout + KILL_GRACE_SECONDS
        log.info("stopping %d workers (SIGTERM); any left after %.1fs gets SIGKILL", len(self.children),
                 self.policy.drain_timeout + KILL_GRACE_SECONDS)
        for pid in list(self.children):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def exit_with_parent(parent: int) -> None:
    """In a just-forked worker: SIGTERM when the supervisor dies (Linux's `PR_SET_PDEATHSIG`,
    through libc's `prctl`); at once if it already has. Elsewhere the heartbeat's `getppid()`
    check (`Pulse`) does it, within a beat interval."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
                log.warning("prctl(PR_SET_PDEATHSIG) failed: %s", os.strerror(ctypes.get_errno()))
        except (OSError, AttributeError) as exc:
            log.warning("prctl(PR_SET_PDEATHSIG) unavailable: %s", exc)
    if os.getppid() != parent:  # it died before the request above
        os.kill(os.getpid(), signal.SIGTERM)


def describe(status: int) -> str:
    """'exited with status 1' or 'was killed by SIGKILL', from a wait status."""
    if os.WIFSIGNALED(status):
        return f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with status {os.waitstatus_to_exitcode(status)}"
