"""The long-lived loops of the background processes (the scheduler's tick, the worker's sweep).

Each round runs on the thread's held database connection (`HeldConnections.run`): a connection
that died with a database restart is replaced before it is used, and one that fails is dropped,
so a round after the database is back starts on a fresh connection. A failed round is logged with
its traceback and tried again after the interval; the first round that succeeds after failures
says so, with how long the loop was failing (an operator reads when the loop recovered).
"""
from __future__ import annotations

import logging
import threading
import time

from models.db import release


def run_every(runtime, stop: threading.Event, interval: float, work, what: str, log: logging.Logger,
              at_once: bool = True) -> None:
    """`work(runtime)` every `interval` seconds until `stop` is set (the first round at once, or
    after one interval). `what` names a round in the log ("scheduler tick")."""
    failures, failing_since = 0, 0.0
    if not at_once and stop.wait(interval):
        return
    while not stop.is_set():
        try:
            runtime.connections.run(work, runtime)
        except Exception:
            if not failures:
                failing_since = time.monotonic()
            failures += 1
            log.exception("%s failed; trying again in %ss", what, interval)
        else:
            if failures:
                log.warning("%s succeeded again after %d failed round(s) over %.1fs", what, failures,
                            time.monotonic() - failing_since)
                failures = 0
        finally:
            if threading.current_thread() is not threading.main_thread():
                release(runtime.db)  # a thread of a serve process gives its pooled connection back
        if stop.wait(interval):
            return
