"""Appending disclosure records for one process (the runtime's `disclosure_writer`).

- `write(fields)`, blocking, from any thread (workers, connectors, the CLI): one append, or, inside
  the caller's transaction, one committed with it.
- `enqueue(fields, future, outcome)`, from a request's pool job right after its domain call: a
  group commit with no thread of its own and no extra pool hop. The first job that finds nobody
  writing leads: it appends every record waiting (its own included) in one transaction, again
  while more arrived meanwhile (at most MAX_ROUNDS transactions: then it hands leadership on to a
  new pool job, so its own request, committed in the first, is not held by a stream of others'
  records), and settles their IOLoop futures once committed, each with its request's `outcome`
  (the answer of its domain call: the pool leaves that future to the writer, so the IOLoop is
  woken once per batch, not once per request and again per batch). A job that finds a leader at
  work leaves its record and returns at once, its thread free for the next request; its handler
  awaits the future. So a busy process pays one chain lock and one commit per batch, and no
  thread is woken per record (a pool hop per record cost a FHIR read 16% of its reads per
  CPU-second). Every request answers only once its own record is committed: "recorded before the
  response completes" holds.
"""
from __future__ import annotations

import asyncio
import threading

import peewee

from audit.chain import append
from errors import ApiError
from models.db import DATABASE_ERRORS

RETRY_AFTER_SECONDS = 2
GATHER_SECONDS = 0.002
"""How long a leader waits for the records of requests whose domain call is queued or running in
this process (PostgreSQL's commit_delay with commit_siblings, per process): one commit for them all."""
MAX_ROUNDS = 8
"""Group commits one leader makes before it hands leadership on (`ChainWriter.handoff`)."""


def audit_unavailable() -> ApiError:
    """The 503 of a request whose record could not be written: nothing was disclosed."""
    return ApiError(503, "audit_unavailable", "The disclosure audit cannot record this request; nothing was "
                                              "disclosed. Retry shortly.", {"Retry-After": str(RETRY_AFTER_SECONDS)})


def _settle(batch: list, failed: bool) -> None:
    """On the futures' IOLoop: each waiter learns that its record is committed, or is not."""
    for _, future, outcome in batch:
        if not future.done():
            if failed:
                future.set_exception(audit_unavailable())
            else:
                future.set_result(outcome)


def _notify(batch: list, failed: bool) -> None:
    """From the writing thread: settle the batch on its IOLoop(s), one wake-up per loop."""
    loops: dict = {}
    for item in batch:
        loops.setdefault(item[1].get_loop(), []).append(item)
    for loop, items in loops.items():
        try:
            loop.call_soon_threadsafe(_settle, items, failed)
        except RuntimeError:
            pass  # that loop is closed: nobody is waiting any more


class ChainWriter:
    """Appends records to the chain for every thread of one process. `handoff(job)` runs `job()` in
    a new unit of work on the runtime's pool: where a leader past MAX_ROUNDS hands leadership on."""

    def __init__(self, db, key: bytes, now, handoff):
        self.db, self.key, self.now, self.handoff = db, key, now, handoff
        self._lock = threading.Lock()
        self._all_in = threading.Condition(self._lock)
        self._pending: list[tuple[dict, asyncio.Future, object]] = []
        self._writing = False
        self._expected: set = set()  # futures of requests whose record is still to come
        self.commits = self.committed = 0  # group commits and the records they held, since start
        self.handoffs = 0  # times a leader handed leadership on (MAX_ROUNDS reached)

    def write(self, fields: dict) -> None:
        """Append one record now (blocking); inside a transaction, as part of it."""
        append(self.db, self.key, [fields], self.now)

    def expect(self, future: asyncio.Future) -> None:
        """A request's domain call is on its way to the pool: its record will follow (`enqueue`)
        or not (`unexpect`). A leader waits a moment for expected records to join its batch."""
        with self._lock:
            self._expected.add(future)

    def unexpect(self, future: asyncio.Future) -> None:
        """No record will follow for `future` (idempotent)."""
        with self._lock:
            self._arrived(future)

    def _arrived(self, future) -> None:
        self._expected.discard(future)
        if not self._expected and self._writing:
            self._all_in.notify()

    def enqueue(self, fields: dict, future: asyncio.Future, outcome=None) -> None:
        """Have `fields` appended in this process's group commit; `future` (of the request's IOLoop)
        is settled with `outcome` once it is committed, or fails with `audit_unavailable`. Called on a pool thread
        inside a unit of work: when this call leads and the database fails, the error goes up too,
        so that unit of work discards the connection."""
        if self._join(fields, future, outcome):
            self._lead()

    def enqueue_soon(self, fields: dict, future: asyncio.Future, outcome=None) -> None:
        """`enqueue` from the IOLoop, which never writes: the record joins the batch being written,
        or, when nobody leads, a pool job leads (`handoff`), one for every record waiting then."""
        if not self._join(fields, future, outcome):
            return
        try:
            self.handoff(self._lead)
        except RuntimeError:  # the pool is shut down: nobody is left to write what waits
            self._fail([])

    def _join(self, fields: dict, future: asyncio.Future, outcome) -> bool:
        """Add a record to what waits: True when nobody leads, the caller now does."""
        with self._lock:
            self._pending.append((fields, future, outcome))
            self._arrived(future)
            if self._writing:
                return False
            self._writing = True
            return True

    def _lead(self) -> None:
        """As the leader: commit what waits, round after round, at most MAX_ROUNDS; then, if more
        waits, hand leadership on (a new pool job leads) and return."""
        for _ in range(MAX_ROUNDS):
            with self._lock:
                if self._expected:  # other requests' calls are queued or running: gather their records
                    self._all_in.wait_for(lambda: not self._expected, GATHER_SECONDS)
                if not self._pending:
                    self._writing = False
                    return
            batch: list = []

            def take() -> list[dict]:
                """Once the chain's lock is held: everything waiting, its own and whatever arrived
                while another process's append held the lock."""
                with self._lock:
                    batch[:], self._pending = self._pending, []
                return [fields for fields, _, _ in batch]
            try:
                append(self.db, self.key, take, self.now)
            except BaseException as exc:
                self._fail(batch)
                if isinstance(exc, DATABASE_ERRORS) or not isinstance(exc, peewee.PeeweeException):
                    raise
                raise audit_unavailable() from exc
            with self._lock:
                self.commits, self.committed = self.commits + 1, self.committed + len(batch)
            _notify(batch, failed=False)
        with self._lock:
            if not self._pending:
                self._writing = False
                return
            self.handoffs += 1
        try:  # still `_writing`: records arriving meanwhile wait for the next leader
            self.handoff(self._lead)
        except RuntimeError:  # the pool is shut down: nobody is left to write what waits
            self._fail([])

    def _fail(self, batch: list) -> None:
        """`batch` and everything waiting fail (`audit_unavailable`); nobody leads any more."""
        with self._lock:
            batch, self._pending, self._writing = batch + self._pending, [], False
        _notify(batch, failed=True)
