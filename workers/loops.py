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

from models.db import DATABASE_ERRORS, release


class StepsFailed(Exception):
    """Steps of a round failed (each logged with its traceback when it failed)."""


def run_steps(runtime, steps, log: logging.Logger) -> None:
    """Each `step(runtime)` of a round in turn, whatever the ones before did: a failed step is
    logged and the rest still run (an object store that refuses one listing must not stop chart
    expiry); then StepsFailed, so the loop counts the round failed. A database error ends the
    round at once, as it is: every step needs the database, and the held connection is dropped."""
    failed = []
    for step in steps:
        try:
            step(runtime)
        except DATABASE_ERRORS:
            raise
        except Exception:
            log.exception("%s failed; the round's other steps still run", step.__name__)
            failed.append(step.__name__)
    if failed:
        raise StepsFailed(f"{len(failed)} of {len(steps)} steps failed: {', '.join(failed)}")


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
        except Exception as exc:
            if not failures:
                failing_since = time.monotonic()
            failures += 1
            if isinstance(exc, StepsFailed):  # each step's traceback is logged already
                log.error("%s failed (%s); trying again in %ss", what, exc, interval)
            else:
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
