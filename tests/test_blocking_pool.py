"""The runtime's pool of threads for blocking work (`runtime.pool.BlockingPool`): what the IOLoop
and other threads get from it, as they got it from a ThreadPoolExecutor."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from runtime.pool import BlockingPool


def test_the_loop_gets_each_jobs_result_or_exception_and_the_thread_it_ran_on():
    pool = BlockingPool(3, "svc-test")

    async def run():
        loop = asyncio.get_running_loop()

        def where(value):
            return value, threading.current_thread().name

        answers = await asyncio.gather(*(pool.run_soon(loop, where, n) for n in range(30)))
        assert [value for value, _ in answers] == list(range(30))
        assert {name for _, name in answers} <= {"svc-test_0", "svc-test_1", "svc-test_2"}
        assert threading.current_thread().name not in {name for _, name in answers}

        def fails():
            raise LookupError("no such row")
        with pytest.raises(LookupError, match="no such row"):
            await pool.run_soon(loop, fails)
        assert await pool.run_soon(loop, lambda a, b=0: a + b, 2, b=3) == 5

    try:
        asyncio.run(run())
    finally:
        pool.shutdown()


def test_other_threads_submit_and_get_concurrent_futures():
    pool = BlockingPool(2, "svc-test")
    try:
        futures = [pool.submit(pow, 2, n) for n in range(10)]
        assert [f.result(5) for f in futures] == [2 ** n for n in range(10)]
        with pytest.raises(ZeroDivisionError):
            pool.submit(lambda: 1 / 0).result(5)
    finally:
        pool.shutdown()


def test_shutdown_runs_what_is_queued_then_refuses_new_work():
    pool = BlockingPool(1, "svc-test")
    gate = threading.Event()
    done = []
    pool.submit(gate.wait, 5)
    queued = [pool.submit(done.append, n) for n in range(5)]
    closer = threading.Thread(target=pool.shutdown)  # waits for the queue to drain
    closer.start()
    time.sleep(0.1)
    assert closer.is_alive() and done == []
    gate.set()
    closer.join(5)
    assert not closer.is_alive() and done == [0, 1, 2, 3, 4] and all(f.done() for f in queued)
    with pytest.raises(RuntimeError):
        pool.submit(done.append, 99)
    pool.shutdown()  # again: nothing left to do


def test_a_job_whose_awaiter_gave_up_before_it_started_does_not_run():
    pool = BlockingPool(1, "svc-test")
    gate = threading.Event()
    ran = []

    async def run():
        loop = asyncio.get_running_loop()
        blocker = pool.run_soon(loop, gate.wait, 5)
        waiting = pool.run_soon(loop, ran.append, "ran")
        waiting.cancel()
        gate.set()
        await blocker
        await pool.run_soon(loop, lambda: None)  # after the cancelled job in the queue
        assert ran == []

    try:
        asyncio.run(run())
    finally:
        pool.shutdown()


def test_jobs_that_wait_on_each_other_get_every_thread():
    """One thread is woken at a time, but while jobs wait each thread that takes one wakes the next:
    8 jobs that each wait until all 8 run at once finish on a pool of 8 (and time out on fewer)."""
    for threads, finishes in ((8, True), (7, False)):
        pool = BlockingPool(threads, "svc-test")
        barrier = threading.Barrier(8, timeout=2)
        try:
            futures = [pool.submit(barrier.wait) for _ in range(8)]
            outcomes = [f.exception(10) for f in futures]
            assert all(o is None for o in outcomes) is finishes, (threads, outcomes)
        finally:
            barrier.abort()
            pool.shutdown()


def test_a_job_that_hands_its_future_on_is_settled_by_whoever_took_it():
    """`run_into`: a job returning DEFERRED leaves its future to the thread it handed it to (the
    pool does not settle it); one that returns anything else, or raises, is settled by the pool."""
    pool = BlockingPool(2, "svc-test")

    async def run():
        loop = asyncio.get_running_loop()
        handed = loop.create_future()

        def hands_on():
            threading.Timer(0.2, loop.call_soon_threadsafe, (handed.set_result, "from the other thread")).start()
            return pool.DEFERRED
        assert await pool.run_into(handed, hands_on) == "from the other thread"
        assert await pool.run_into(loop.create_future(), lambda: 42) == 42
        with pytest.raises(KeyError):
            await pool.run_into(loop.create_future(), {}.__getitem__, "x")

    try:
        asyncio.run(run())
    finally:
        pool.shutdown()
