"""The running service's shared parts, built once from `Settings` and handed to handlers and CLI."""
from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor

from conf import Settings
from keys.secrets import SecretHasher, load_hmac_key
from keys.signing import KeyRing
from models.clock import clock
from models.db import open_database
from oauth.tokens import TokenService
from ratelimit import build_rate_limiter
from ratelimit.failures import FailurePolicy, build_failure_throttle
from ratelimit.policy import Limit


_current: "Runtime | None" = None


def current_runtime() -> "Runtime":
    """The newest Runtime of this process (background tasks and enqueue helpers use it)."""
    if _current is None:
        raise RuntimeError("no Runtime has been built in this process")
    return _current


class Runtime:
    """Database, keys and token service of one process (each forked process builds its own)."""

    def __init__(self, settings: Settings):
        global _current
        self.settings = settings
        self.clock = clock
        self.db = open_database(settings.database_url)
        self.hasher = SecretHasher(load_hmac_key(settings.hmac_key, settings.keys_dir))
        retain = max(settings.id_token_ttl, settings.access_token_ttl, settings.client_token_ttl,
                     settings.sandbox_token_ttl)
        self.keyring = KeyRing(settings.keys_dir, retain_seconds=retain, clock=clock.time)
        self.tokens = TokenService(self.keyring, settings.issuer_claim)
        # Partner REST API limits: Redis when configured (connects on first use), else in-memory.
        self.rate_limiter = build_rate_limiter(settings)
        # Failed client authentication (token, introspect, revoke) per client_id and address.
        self.client_auth_throttle = build_failure_throttle(
            settings, "client_auth", self.failure_policy(), lambda: self.clock.time())
        self._object_store = None
        self._task_queue = None
        self.draining = False  # set on SIGTERM: readiness fails while in-flight requests finish
        # Blocking work (database, S3, the broker) runs here, never on the IOLoop.
        self.executor = ThreadPoolExecutor(max_workers=settings.db_threads, thread_name_prefix="svc-blocking")
        _current = self

    def failure_policy(self) -> FailurePolicy:
        """The configured failure limits (SVC_AUTH_FAILURE_LIMIT, SVC_AUTH_ADDRESS_FAILURE_LIMIT)."""
        return FailurePolicy(subject=Limit(*self.settings.auth_failure_limit),
                             address=Limit(*self.settings.auth_address_failure_limit))

    @property
    def object_store(self):
        """Where chart ZIPs live: S3 (boto3) when SVC_S3_BUCKET is set, else `var/objects/` (built lazily)."""
        if self._object_store is None:
            from storage import open_object_store
            self._object_store = open_object_store(self.settings, self.hasher)
        return self._object_store

    @property
    def task_queue(self):
        """The Dramatiq broker (Redis, or in-process with its own worker thread), built lazily."""
        if self._task_queue is None:
            from workers.broker import install_task_queue
            self._task_queue = install_task_queue(self)
        return self._task_queue

    async def run(self, fn, /, *args, **kwargs):
        """Run blocking `fn(*args, **kwargs)` on the runtime's bounded thread pool and await it.

        Every database, S3, Redis (sync client) and enqueue call made from a request goes through
        here, so a slow dependency occupies a pool thread, never the IOLoop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))

    def migrate(self) -> list[str]:
        from models.schema import migrate
        return migrate()

    def close(self) -> None:
        self.executor.shutdown(wait=True)
        if self._task_queue is not None:
            self._task_queue.close()
            self._task_queue = None
        if not self.db.is_closed():
            self.db.close()
