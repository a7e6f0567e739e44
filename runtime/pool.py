"""`BlockingPool`: the runtime's threads for blocking work (database, S3, Redis's sync client).

A `concurrent.futures.Executor`, so threads hand it work as they would a ThreadPoolExecutor
(`submit`, `shutdown`), with one more door for the IOLoop: `run_soon(loop, fn, ...)` gives an
asyncio future that the pool thread settles with one `call_soon_threadsafe`. Through
`loop.run_in_executor` the same job made a `concurrent.futures.Future` (with its Condition and
lock), chained it to an asyncio future with callbacks on both sides, and took the executor's
lock and idle semaphore on every submit: 20 µs of CPU per job against 4.5 µs this way
(`bench`-style microbenchmark, 16 tasks, 8 threads, uvloop), and every FHIR request makes one.
"""
from __future__ import annotations

import collections
import concurrent.futures
import threading


class _Deferred:
    __slots__ = ()

    def __repr__(self) -> str:
        return "DEFERRED"


DEFERRED = _Deferred()
"""What a `run_into` job returns when it handed its future to another thread to settle (the
disclosure audit's group commit settles a request's future once its record is committed): the
pool then leaves that future alone, and the loop is woken once, by the other thread."""


def _settle(future, failed: bool, value) -> None:
    """On the loop: the job's outcome onto its future, unless its awaiter gave up on it or another
    thread settled it first (a job that raised after handing its future on)."""
    if future.done():
        return
    if failed:
        future.set_exception(value)
    else:
        future.set_result(value)


def _run(job) -> None:
    """One job on a pool thread: its outcome onto its future (settled on its loop, for `run_soon`)."""
    loop, future, fn, args, kwargs = job
    if loop is None:
        if future.set_running_or_notify_cancel():
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)
        return
    if future.cancelled():  # read from this thread: at worst the job runs and its outcome is dropped
        return
    try:
        value = fn(*args, **kwargs)
    except BaseException as exc:
        outcome = True, exc
    else:
        if value is DEFERRED:
            return
        outcome = False, value
    try:
        loop.call_soon_threadsafe(_settle, future, *outcome)
    except RuntimeError:
        pass  # the loop is closed: nobody awaits this any more


class BlockingPool(concurrent.futures.Executor):
    """`threads` threads named `{name}_{i}`, started at the first job, taking jobs in order from one
    queue. `shutdown` lets the jobs already queued run, then ends the threads; a job submitted
    after it is refused with RuntimeError, as ThreadPoolExecutor refuses it.

    At most one sleeping thread is being woken at a time: a job put while another thread is on
    its way wakes nobody more, and each thread that takes a job wakes the next sleeper only if
    jobs are still waiting. A burst of short jobs is taken by the threads already awake, instead
    of waking every thread at once to contend for the GIL; jobs that wait on I/O still spread
    over every thread, one wake-up after another."""

    DEFERRED = DEFERRED

    def __init__(self, threads: int, name: str):
        self.size, self.name = threads, name
        self._jobs: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._sleepers: list[threading.Lock] = []  # each sleeping thread's wake lock (held while it sleeps)
        self._waking = False  # a sleeper was woken and has not yet looked at the queue
        self._closed = False
        self._threads: list[threading.Thread] = []

    def _put(self, job) -> None:
        if not self._threads:
            self._start()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._jobs.append(job)
            if self._waking or not self._sleepers:
                return
            self._waking = True
            wake = self._sleepers.pop()
        wake.release()

    def _start(self) -> None:
        with self._lock:
            if self._threads or self._closed:
                return
            threads = [threading.Thread(target=self._work, name=f"{self.name}_{index}", daemon=True)
                       for index in range(self.size)]
            for thread in threads:
                thread.start()
            self._threads = threads

    def submit(self, fn, /, *args, **kwargs) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._put((None, future, fn, args, kwargs))
        return future

    def run_soon(self, loop, fn, /, *args, **kwargs):
        """An asyncio future (of `loop`) of `fn(*args, **kwargs)` run on a pool thread."""
        return self.run_into(loop.create_future(), fn, *args, **kwargs)

    def run_into(self, future, fn, /, *args, **kwargs):
        """`run_soon` onto the asyncio future given (returned): settled with the job's outcome, unless
        the job returns DEFERRED (whoever it handed `future` to settles it)."""
        self._put((future.get_loop(), future, fn, args, kwargs))
        return future

    def _work(self) -> None:
        wake = threading.Lock()
        wake.acquire()  # held: `acquire` again sleeps until a waker releases it
        jobs, lock, woken = self._jobs, self._lock, False
        while True:
            following = None
            with lock:
                if woken:  # the one thread on its way has arrived
                    self._waking = woken = False
                idle = not jobs
                if idle:
                    self._sleepers.append(wake)
                else:
                    job = jobs.popleft()
                    if jobs and self._sleepers and not self._waking:  # more wait: the next sleeper comes
                        self._waking = True
                        following = self._sleepers.pop()
            if idle:
                wake.acquire()
                woken = True
                continue
            if following is not None:
                following.release()
            if job is None:
                return
            _run(job)
            del job  # nothing of a finished job is held while this thread waits for the next

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Queued jobs still run (`cancel_futures` is not supported: nothing here cancels work)."""
        with self._lock:
            if self._closed:
                threads = []
            else:
                self._closed = True
                threads = self._threads
                self._jobs.extend([None] * len(threads))
            sleepers, self._sleepers = self._sleepers, []  # every thread wakes to take its end
        for wake in sleepers:
            wake.release()
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()
