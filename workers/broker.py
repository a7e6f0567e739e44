"""The task queue of a process: a Dramatiq broker chosen by configuration alone.

`SVC_REDIS_URL` set: a RedisBroker whose keys start with `SVC_REDIS_NAMESPACE`, shared by every
`serve`, `worker` and `scheduler` process. Unset (embedded default): Dramatiq's in-memory
StubBroker with a worker thread in the same process.

Each `TaskQueue` belongs to one runtime (`runtime.task_queue`) and declares its own actors, one
per `@task` declaration, each calling `fn(runtime, *args)`. There is no process-wide broker.
"""
from __future__ import annotations

import logging

import dramatiq
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import CurrentMessage, Middleware

from workers.charts import build_chart
from workers.export import build_export
from workers.snapshot import sync_night, sync_organization
from workers.tasks import spec_of

# Every background task, explicitly (each runtime's TaskQueue declares one actor per entry).
TASK_FUNCTIONS = (build_chart, sync_night, sync_organization, build_export)

log = logging.getLogger("svc_auth.workers")


class DatabaseConnection(Middleware):
    """Each task opens the database connection of its worker thread and closes it when done."""

    def __init__(self, db):
        self.db = db

    def before_process_message(self, broker, message):
        self.db.connect(reuse_if_open=True)

    def after_process_message(self, broker, message, *, result=None, exception=None):
        if not self.db.is_closed():
            self.db.close()

    after_skip_message = after_process_message


class JobMetrics(Middleware):
    """Counts every finished attempt in the runtime's metrics (`svc_jobs_total`)."""

    def __init__(self, metrics):
        self.metrics = metrics

    def after_process_message(self, broker, message, *, result=None, exception=None):
        self.metrics.count_job(message.actor_name, "succeeded" if exception is None else "failed")


class TaskQueue:
    """One runtime's broker and actors, and (embedded default) the worker thread that consumes it."""

    def __init__(self, runtime):
        settings = self.settings = runtime.settings
        if settings.redis_url:
            from dramatiq.brokers.redis import RedisBroker
            self.broker = RedisBroker(url=settings.redis_url, namespace=f"{settings.redis_namespace}:tasks")
            self.embedded = False
        else:
            self.broker = StubBroker()
            self.embedded = True
        self.broker.add_middleware(CurrentMessage())
        self.broker.add_middleware(DatabaseConnection(runtime.db))
        self.broker.add_middleware(JobMetrics(runtime.metrics))
        self.worker: dramatiq.Worker | None = None
        retry = {"max_retries": settings.task_max_retries, "min_backoff": settings.task_min_backoff_ms,
                 "max_backoff": settings.task_max_backoff_ms}
        self.actors = {spec.name: self._actor(runtime, spec, retry) for spec in map(spec_of, TASK_FUNCTIONS)}
        if self.embedded:
            self.start_worker()

    def _actor(self, runtime, spec, retry) -> dramatiq.Actor:
        def run(*args):
            return spec.fn(runtime, *args)
        run.__name__ = spec.name
        return dramatiq.Actor(run, actor_name=spec.name, queue_name=spec.queue_name, priority=0,
                              broker=self.broker, options={**retry, **spec.options})

    def send(self, task_fn, *args, delay_ms: int | None = None) -> dramatiq.Message:
        """Enqueue `task_fn(runtime, *args)` on this queue's broker (a blocking call: off the IOLoop)."""
        return self.send_message(self.message(task_fn, *args), delay_ms=delay_ms)

    def message(self, task_fn, *args) -> dramatiq.Message:
        """The message of `task_fn(runtime, *args)`, not sent yet: its id is known before it is
        sent (workers.recovery hands a lease to it)."""
        return self.actors[task_fn.__name__].message(*args)

    def send_message(self, message: dramatiq.Message, delay_ms: int | None = None) -> dramatiq.Message:
        return self.broker.enqueue(message, delay=delay_ms)

    def last_attempt(self) -> bool:
        from workers.tasks import current_message_is_last_attempt
        return current_message_is_last_attempt(self.broker)

    def start_worker(self, threads: int | None = None, timeout_ms: int | None = None) -> dramatiq.Worker:
        """Consume this broker's queues with `threads` threads (returns at once)."""
        if self.worker is None:
            self.worker = dramatiq.Worker(self.broker, worker_threads=threads or self.settings.worker_threads,
                                          worker_timeout=timeout_ms or (100 if self.embedded else 1000))
            self.worker.start()
        return self.worker

    def close(self) -> None:
        if self.worker is not None:
            self.worker.stop(timeout=30_000)
            self.worker = None
        self.broker.close()
