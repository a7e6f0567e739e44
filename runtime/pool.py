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

import concurrent.futures
import queue
import threading


def _settle(future, failed: bool, value) -> None:
    """On the loop: the job's outcome onto its future, unless its awaiter gave up on it."""
    if future.cancelled():
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
        outcome = False, fn(*args, **kwargs)
    except BaseException as exc:
        outcome = True, exc
    try:
        loop.call_soon_threadsafe(_settle, future, *outcome)
    except RuntimeError:
        pass  # the loop is closed: nobody awaits this any more


class BlockingPool(concurrent.futures.Executor):
    """`threads` threads named `{name}_{i}`, started at the first job, taking jobs in order from one
    queue. `shutdown` lets the jobs already queued run, then ends the threads; a job submitted
    after it is refused with RuntimeError, as ThreadPoolExecutor refuses it."""

    def __init__(self, threads: int, name: str):
        self.size, self.name = threads, name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._threads: list[threading.Thread] = []

    def _put(self, job) -> None:
        if not self._threads:
            self._start()
        with self._lock:  # not between `shutdown`'s sentinels and the threads' end: it would never run
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._jobs.put(job)

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
        future = loop.create_future()
        self._put((loop, future, fn, args, kwargs))
        return future

    def _work(self) -> None:
        jobs = self._jobs
        while True:
            job = jobs.get()
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
                for _ in threads:
                    self._jobs.put(None)
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()
