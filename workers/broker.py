"""The task queue of a process: a Dramatiq broker chosen by configuration alone.

`SVC_REDIS_URL` set: a RedisBroker whose keys start with `SVC_REDIS_NAMESPACE`, shared by every
`serve`, `worker` and `scheduler` process. Unset (embedded default): Dramatiq's in-memory
StubBroker with a worker thread in the same process.

Actors are declared once at import with `@task(...)`; `install_task_queue` binds them to the
process's broker (one broker per process; a new one replaces the old, which tests rely on).
"""
from __future__ import annotations

import logging
import threading

import dramatiq
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import CurrentMessage, Middleware

from models.db import database

log = logging.getLogger("svc_auth.workers")

ACTORS: list[dramatiq.Actor] = []
_declaration_broker = StubBroker()  # actors need a broker to be declared; the real one is bound later
_lock = threading.Lock()
_installed: "TaskQueue | None" = None


def task(**options):
    """Declare a background task (a Dramatiq actor) retried with the configured backoff."""
    def decorate(fn):
        actor = dramatiq.actor(fn, broker=_declaration_broker, actor_name=fn.__name__, **options)
        ACTORS.append(actor)
        return actor
    return decorate


class DatabaseConnection(Middleware):
    """Each task opens the database connection of its worker thread and closes it when done."""

    def before_process_message(self, broker, message):
        database.connect(reuse_if_open=True)

    def after_process_message(self, broker, message, *, result=None, exception=None):
        if not database.is_closed():
            database.close()

    after_skip_message = after_process_message


class TaskQueue:
    """One process's broker, and (embedded default) the worker thread that consumes it."""

    def __init__(self, settings):
        self.settings = settings
        if settings.redis_url:
            from dramatiq.brokers.redis import RedisBroker
            self.broker = RedisBroker(url=settings.redis_url, namespace=f"{settings.redis_namespace}:tasks")
            self.embedded = False
        else:
            self.broker = StubBroker()
            self.embedded = True
        self.broker.add_middleware(CurrentMessage())
        self.broker.add_middleware(DatabaseConnection())
        self.worker: dramatiq.Worker | None = None

    def bind_actors(self) -> None:
        retry = {"max_retries": self.settings.task_max_retries,
                 "min_backoff": self.settings.task_min_backoff_ms,
                 "max_backoff": self.settings.task_max_backoff_ms}
        for actor in ACTORS:
            actor.options.update(retry)
            actor.broker = self.broker
            self.broker.declare_actor(actor)
        dramatiq.set_broker(self.broker)

    def send(self, actor: dramatiq.Actor, *args, delay_ms: int | None = None) -> dramatiq.Message:
        """Enqueue `actor(*args)` on this process's broker."""
        return self.send_message(actor.message(*args), delay_ms=delay_ms)

    def send_message(self, message: dramatiq.Message, delay_ms: int | None = None) -> dramatiq.Message:
        """Enqueue a message built beforehand (its id is known before it is sent: recovery leases)."""
        return self.broker.enqueue(message, delay=delay_ms)

    def start_worker(self, threads: int | None = None, timeout_ms: int | None = None) -> dramatiq.Worker:
        """Consume this broker's queues with `threads` threads (returns at once)."""
        if self.worker is None:
            self.worker = dramatiq.Worker(self.broker, worker_threads=threads or self.settings.worker_threads,
                                          worker_timeout=timeout_ms or (100 if self.embedded else 1000))
            self.worker.start()
        return self.worker

    def close(self) -> None:
        global _installed
        if self.worker is not None:
            self.worker.stop(timeout=30_000)
            self.worker = None
        self.broker.close()
        with _lock:
            if _installed is self:
                _installed = None


def install_task_queue(runtime) -> TaskQueue:
    """Make a task queue for `runtime`'s settings this process's broker and bind every actor to it.

    In the embedded default, this also starts the in-process worker thread.
    """
    global _installed
    import workers.charts  # noqa: F401  (declares the actors)
    import workers.snapshot  # noqa: F401
    with _lock:
        previous, _installed = _installed, None
    if previous is not None:
        previous.close()
    queue = TaskQueue(runtime.settings)
    queue.bind_actors()
    with _lock:
        _installed = queue
    if queue.embedded:
        queue.start_worker()
    return queue


def current_message_is_last_attempt() -> bool:
    """True while a task runs its final attempt (after it, Dramatiq gives up)."""
    message = CurrentMessage.get_current_message()
    if message is None:
        return True  # called directly, not by a worker: there is no retry
    actor = message.options.get("max_retries")
    max_retries = actor if actor is not None else dramatiq.get_broker().get_actor(message.actor_name).options.get(
        "max_retries", 20)
    return message.options.get("retries", 0) >= max_retries
