"""The composition root: a process's shared parts, built once from `Settings` and passed down.

`serve` builds one `Runtime` per (forked) process and hands it to handlers through the Tornado
application settings; the CLI builds one per command; the task queue binds every Dramatiq actor to
the runtime that installed it. Nothing here is reachable through a module global: whoever needs
the database, the clock or the queue is given the runtime (or the part it needs).
"""
from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor

from conf import Settings
from keys.secrets import SecretHasher, load_hmac_key
from keys.signing import KeyRing
from models.clock import Clock
from models.db import open_database
from models.schema import bind_models
from oauth.tokens import TokenService
from ratelimit import build_rate_limiter
from ratelimit.failures import FailurePolicy, build_failure_throttle
from ratelimit.policy import Limit


class Runtime:
    """Database, clock, keys, token service and thread pool of one process (each forked process
    builds its own)."""

    def __init__(self, settings: Settings, clock: Clock | None = None):
        self.settings = settings
        self.clock = clock or Clock()
        self.db = open_database(settings.database_url)
        bind_models(self.db)  # Peewee's Database.bind: the models now query this database
        self.hasher = SecretHasher(load_hmac_key(settings.hmac_key, settings.keys_dir))
        retain = max(settings.id_token_ttl, settings.access_token_ttl, settings.client_token_ttl,
                     settings.sandbox_token_ttl)
        self.keyring = KeyRing(settings.keys_dir, retain_seconds=retain, clock=self.clock.time)
        self.tokens = TokenService(self.keyring, settings.issuer_claim, self.clock)
        # Partner REST API limits: Redis when configured (connects on first use), else in-memory.
        self.rate_limiter = build_rate_limiter(settings, self.clock)
        # Failed client authentication (token, introspect, revoke) per client_id and address.
        self.client_auth_throttle = build_failure_throttle(
            settings, "client_auth", self.failure_policy(), self.clock.time)
        self._object_store = None
        self._task_queue = None
        self.draining = False  # set on SIGTERM: readiness fails while in-flight requests finish
        # Blocking work (database, S3, the broker) runs here, never on the IOLoop.
        self.executor = ThreadPoolExecutor(max_workers=settings.db_threads, thread_name_prefix="svc-blocking")

    def failure_policy(self) -> FailurePolicy:
        """The configured failure limits (SVC_AUTH_FAILURE_LIMIT, SVC_AUTH_ADDRESS_FAILURE_LIMIT)."""
        return FailurePolicy(subject=Limit(*self.settings.auth_failure_limit),
                             address=Limit(*self.settings.auth_address_failure_limit))

    @property
    def object_store(self):
        """Where chart ZIPs live: S3 (boto3) when SVC_S3_BUCKET is set, else `var/objects/` (built lazily)."""
        if self._object_store is None:
            from storage import open_object_store
            self._object_store = open_object_store(self.settings, self.hasher, self.clock)
        return self._object_store

    @property
    def task_queue(self):
        """The Dramatiq broker (Redis, or in-process with its own worker thread), built lazily."""
        if self._task_queue is None:
            from workers.broker import TaskQueue
            self._task_queue = TaskQueue(self)
        return self._task_queue

    async def run(self, fn, /, *args, **kwargs):
        """Run blocking `fn(*args, **kwargs)` on the runtime's bounded thread pool and await it.

        Every database, S3, Redis (sync client) and enqueue call made from a request goes through
        here, so a slow dependency occupies a pool thread, never the IOLoop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))

    def migrate(self) -> list[str]:
        from models.schema import migrate
        return migrate(self.db)

    def close(self) -> None:
        self.executor.shutdown(wait=True)
        if self._task_queue is not None:
            self._task_queue.close()
            self._task_queue = None
        if not self.db.is_closed():
            self.db.close()
