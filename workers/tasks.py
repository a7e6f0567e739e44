"""Declaring background tasks: `@task(...)` marks a plain function `fn(runtime, *args)`.

The mark is an attribute of the function (`task_spec`), not an entry in a module-level registry:
`workers.broker` lists the task functions explicitly, and each runtime's `TaskQueue` turns them
into Dramatiq actors of its own broker, with its runtime bound as the first argument.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import dramatiq
from dramatiq.middleware import CurrentMessage


@dataclass(frozen=True)
class TaskSpec:
    fn: object
    queue_name: str
    options: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.fn.__name__


def task(queue_name: str = "default", **options):
    """Declare a background task; the function stays callable directly as `fn(runtime, *args)`."""
    def decorate(fn):
        fn.task_spec = TaskSpec(fn, queue_name, options)
        return fn
    return decorate


def spec_of(fn) -> TaskSpec:
    """The declaration of a `@task` function (TypeError for anything else)."""
    spec = getattr(fn, "task_spec", None)
    if not isinstance(spec, TaskSpec):
        raise TypeError(f"{fn!r} is not declared with @task")
    return spec


def current_message_is_last_attempt(broker: dramatiq.Broker) -> bool:
    """True while a task runs its final attempt on `broker` (after it, Dramatiq gives up)."""
    message = CurrentMessage.get_current_message()
    if message is None:
        return True  # called directly, not by a worker: there is no retry
    max_retries = message.options.get("max_retries")
    if max_retries is None:
        max_retries = broker.get_actor(message.actor_name).options.get("max_retries", 20)
    return message.options.get("retries", 0) >= max_retries
