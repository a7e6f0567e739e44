"""Group commit of disclosure records: one transaction, one chain lock and one commit for every
record waiting in this process, so a busy server pays for the lock and the commit once per batch.

No thread of its own: the first caller that finds nobody writing leads, takes every record
waiting (its own included), appends them in one transaction, wakes the others, and hands the
lead to the next waiter if more arrived meanwhile. Every caller returns only once its own record
is committed, so the rule "recorded before the response completes" holds.
"""
from __future__ import annotations

import threading

from audit.chain import append
from errors import ApiError

RETRY_AFTER_SECONDS = 2


class _Waiter:
    __slots__ = ("fields", "done", "failed", "lead")

    def __init__(self, fields: dict):
        self.fields, self.done, self.failed, self.lead = fields, threading.Event(), False, False


class ChainWriter:
    """Appends records for every thread of one process (the runtime's `disclosure_writer`)."""

    def __init__(self, db, key: bytes, now):
        self.db, self.key, self.now = db, key, now
        self._lock = threading.Lock()
        self._pending: list[_Waiter] = []
        self._writing = False

    def write(self, fields: dict) -> None:
        if self.db.in_transaction():  # inside a caller's transaction: only its own record, committed with it
            append(self.db, self.key, [fields], self.now)
            return
        me = _Waiter(fields)
        with self._lock:
            self._pending.append(me)
            lead, self._writing = not self._writing, True
        if not lead:
            me.done.wait()
            if not me.lead:
                if me.failed:
                    raise ApiError(503, "audit_unavailable", "The disclosure audit cannot record this request; "
                                   "nothing was disclosed. Retry shortly.", {"Retry-After": str(RETRY_AFTER_SECONDS)})
                return
        with self._lock:
            batch, self._pending = self._pending, []
        try:
            append(self.db, self.key, [w.fields for w in batch], self.now)
            failed = False
        except BaseException:
            failed = True
            raise  # the leader's own error: its connection is the one that failed (Runtime.unit_of_work)
        finally:
            with self._lock:
                if self._pending:
                    self._pending[0].lead = True
                    self._pending[0].done.set()
                else:
                    self._writing = False
            for waiter in batch:
                if waiter is not me:
                    waiter.failed = failed
                    waiter.done.set()
