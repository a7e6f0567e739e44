"""The composition root: a process's shared parts, built once from `Settings` and passed down.

`serve` builds one `Runtime` per (forked) process and hands it to handlers through the Tornado
application settings; the CLI builds one per command; the task queue binds every Dramatiq actor to
the runtime that installed it. Nothing here is reachable through a module global: whoever needs
the database, the clock or the queue is given the runtime (or the part it needs).
"""
from __future__ import annotations

import asyncio
import threading

from playhouse.pool import PooledDatabase
from redis.exceptions import ConnectionError as RedisConnectionError, TimeoutError as RedisTimeoutError

from audit.chain import KEY_LABEL as DISCLOSURE_KEY_LABEL
from audit.writer import ChainWriter
from conf import Settings
from fhir_api import fhir_base_url
from app_cache.applications import TOPIC as APPLICATIONS, ApplicationCache
from app_cache.changes import ChangeFeed
from app_cache.directory import DirectoryCache
from models.changes import Versions
from keys.ehr_client import EhrClientKeys
from keys.encryption import KeyCipher
from keys.secrets import SecretHasher, load_hmac_key, previous_hmac_keys
from keys.signing import TOPIC as SIGNING_KEYS, KeyRing
from lifecycle import activation
from models.clock import Clock
from models.db import DATABASE_ERRORS, HeldConnections, open_database
from models.schema import bind_models
from oauth.client_jwks import ClientKeySets
from oauth.denylist import build_denylist
from oauth.errors import dependency_unavailable
from oauth.tokens import TokenService
from ops.readiness import Readiness
from ratelimit import RateLimiterUnavailable, build_rate_limiter
from ratelimit.concurrency import ConcurrencyCap
from ratelimit.failures import FailurePolicy, build_failure_throttle
from ratelimit.policy import Limit
from storage import store_unreachable
from runtime.pool import BlockingPool


class Runtime:
    """Database, clock, keys, token service and thread pool of one process (each forked process
    builds its own)."""

    def __init__(self, settings: Settings, clock: Clock | None = None):
        self.settings = settings
        # SVC_CLOCK_OFFSET is test-only: child processes of the tests run "tomorrow night" with it.
        self.clock = clock or Clock(settings.clock_offset)
        # One pooled connection per pool thread, the task worker's threads and the scheduler.
        self.db = open_database(settings.database_url,
                                max_connections=settings.db_threads + settings.worker_threads + 2)
        self.connections = HeldConnections(self.db)
        bind_models(self.db)  # Peewee's Database.bind: the models now query this database
        # SVC_HMAC_KEY makes everything; SVC_HMAC_KEY_PREVIOUS (a rotation) still verifies and opens.
        secret = load_hmac_key(settings.hmac_key, settings.keys_dir)
        previous = previous_hmac_keys(settings.hmac_key_previous)
        self.hasher = SecretHasher(secret, previous)
        retain = max(settings.id_token_ttl, settings.access_token_ttl, settings.client_token_ttl,
                     settings.sandbox_token_ttl)
        self.keyring = KeyRing(self.db, KeyCipher(secret, previous), retain_seconds=retain,
                               prepublish_seconds=settings.key_prepublish_seconds, clock=self.clock.time,
                               legacy_dir=settings.keys_dir)
        self.tokens = TokenService(self.keyring, settings.issuer_claim, self.clock)
        # Hot-path state in memory (applications, keys), refreshed on change; see app_cache/.
        self.changes = ChangeFeed(self.db, settings.redis_url, settings.redis_namespace)
        self.applications = ApplicationCache()
        self.changes.subscribe(APPLICATIONS, self.applications.clear)
        self.versions = Versions()  # the triggers' change versions, read once per unit of work
        self.directory = DirectoryCache(self.versions)  # the bearer gate's users, checked against them
        self.changes.subscribe(SIGNING_KEYS, self.keyring.load)
        self.changes.subscribe(SIGNING_KEYS, self.tokens.forget)
        self.denylist = build_denylist(settings, self.clock, self.versions)
        # What an installation's status allows (`lifecycle.activation`), for oauth/ and fhir_api/,
        # which lifecycle/ imports: they ask it here, as they ask `fhir_base_url`.
        self.activation = activation
        # Partner REST API and FHIR API limits: Redis when configured (connects on first use), else in-memory.
        self.rate_limiter = build_rate_limiter(settings, self.clock)
        # FHIR API reads and searches in progress per clinic in this process (SVC_FHIR_EHR_CONCURRENCY).
        self.ehr_concurrency = ConcurrencyCap(settings.fhir_ehr_concurrency)
        # Failed client authentication (token, introspect, revoke) per client_id and address.
        self.client_auth_throttle = build_failure_throttle(
            settings, "client_auth", self.failure_policy(), self.clock.time, self.hasher)
        # Failed sandbox sign-in links, per address.
        self.sandbox_signin_throttle = build_failure_throttle(
            settings, "sandbox_signin", self.failure_policy(), self.clock.time, self.hasher)
        # Failed console sign-ins, per account and per address.
        self.console_signin_throttle = build_failure_throttle(
            settings, "console_signin", self.console_signin_policy(), self.clock.time, self.hasher)
        # Backend apps' public keys (SMART Backend Services): JWKS URLs fetched and cached per app.
        self.client_jwks = ClientKeySets(monotonic=self.clock.time, max_fetches=settings.db_threads // 4)
        self.changes.subscribe(APPLICATIONS, self.client_jwks.recheck)  # a re-registered URL is fetched again
        self._object_stores: dict = {}
        self._task_queue = None
        self._metrics = None
        # svc-auth's keys at FHIR EHRs (/ehr/jwks.json; `ehr rotate-key`)
        self.ehr_keys = EhrClientKeys(self.keyring.cipher, settings.ehr_key_overlap_seconds, clock=self.clock.time)
        self._connector_states: dict = {}
        self._connector_states_lock = threading.Lock()
        # The disclosure audit's chain (audit/): group-committed appends, under a key derived from SVC_HMAC_KEY.
        self.disclosure_writer = ChainWriter(self.db, self.hasher.derive(DISCLOSURE_KEY_LABEL), self.clock.now,
                                             handoff=lambda job: self.executor.submit(self.unit_of_work, job))
        self.readiness = Readiness()  # /readyz: named dependency checks; parts may add theirs
        self.draining = False  # set on SIGTERM: readiness fails while in-flight requests finish
        # Blocking work (database, S3, the broker) runs here, never on the IOLoop.
        self.executor = BlockingPool(settings.db_threads, "svc-blocking")

    def fhir_base_url(self, organization_id: str) -> str:
        """One clinic's FHIR base (`iss` of a SMART launch, the `aud` authorize accepts). Through the
        runtime so the authorization server (oauth/) needs no import of the FHIR API that imports it."""
        return fhir_base_url(self.settings, organization_id)

    def failure_policy(self) -> FailurePolicy:
        """The configured failure limits (SVC_AUTH_FAILURE_LIMIT, SVC_AUTH_ADDRESS_FAILURE_LIMIT)."""
        return FailurePolicy(subject=Limit(*self.settings.auth_failure_limit),
                             address=Limit(*self.settings.auth_address_failure_limit))

    def console_signin_policy(self) -> FailurePolicy:
        """SVC_CONSOLE_SIGNIN_FAILURE_LIMIT per account and per address. A console password is a
        person's guessable secret: a locked account refuses even the right password, except from a
        browser with a device cookie of the account, which has its own count (`console.devices`)."""
        limit = Limit(*self.settings.console_signin_failure_limit)
        return FailurePolicy(subject=limit, address=limit)

    @property
    def object_store(self):
        """Where chart ZIPs live: S3 (boto3) when SVC_S3_BUCKET is set, else `var/objects/` (built lazily).
        For calls made while an HTTP request waits: short timeouts (SVC_S3_TIMEOUT)."""
        return self._store(batch=False)

    @property
    def batch_object_store(self):
        """The same store for the workers' uploads and the sweeps: longer timeouts (SVC_S3_BATCH_TIMEOUT)."""
        return self._store(batch=True)

    def _store(self, batch: bool):
        if batch not in self._object_stores:
            from storage import open_object_store
            self._object_stores[batch] = open_object_store(self.settings, self.hasher, self.clock, batch=batch)
        return self._object_stores[batch]

    @property
    def metrics(self):
        """This process's Prometheus metrics (built on first use: after `serve` chose multiprocess mode)."""
        if self._metrics is None:
            from ops.metrics import Metrics
            self._metrics = Metrics()
        return self._metrics

    def connector_state(self, name: str, factory):
        """What connector `name` keeps for this process (caches, tokens): built once by `factory()`,
        owned by the connector's own module; the runtime only holds it."""
        with self._connector_states_lock:
            state = self._connector_states.get(name)
            if state is None:
                state = self._connector_states[name] = factory()
            return state

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
        here, so a slow dependency occupies a pool thread, never the IOLoop. The work counts as
        asked for now (`Versions.mark`), while the request is being handled, not when a pool
        thread gets to it."""
        return await self.executor.run_soon(asyncio.get_running_loop(), self._unit, self.versions.mark(),
                                            fn, args, kwargs)

    def run_into(self, future, fn, /, *args):
        """`run` onto the IOLoop's `future` (returned, to await): settled with `fn(*args)`'s outcome,
        unless `fn` returns `runtime.pool.DEFERRED`, having handed `future` on (`audit.disclosures.Recording`)."""
        return self.executor.run_into(future, self._unit, self.versions.mark(), fn, args, {})

    def unit_of_work(self, fn, /, *args, **kwargs):
        """`fn(*args, **kwargs)` on this thread's database connection, which the thread keeps.

        The one place dependency outages of blocking work are mapped: a database connection that
        failed (PostgreSQL gone or restarted, SQLite locked past its busy timeout) is discarded, and
        the request answers 503 `temporarily_unavailable` with Retry-After, never a 500. Redis
        unreachable from a sync call (the failed-authentication counts, the broker) is the same, and
        so is the object store (S3) unreachable or answering 5xx (`storage.store_unreachable`)."""
        return self._unit(None, fn, args, kwargs)

    def _unit(self, asked_at: int | None, fn, args: tuple, kwargs: dict):
        """`unit_of_work` of work asked for at `asked_at` (`Versions.mark`; None: now)."""
        self.versions.begin(asked_at)
        try:
            return self.connections.run(fn, *args, **kwargs)
        except DATABASE_ERRORS as exc:
            raise dependency_unavailable("database") from exc
        except (RateLimiterUnavailable, RedisConnectionError, RedisTimeoutError) as exc:
            raise dependency_unavailable("Redis") from exc
        except Exception as exc:
            if store_unreachable(exc):
                raise dependency_unavailable("object store") from exc
            raise
        finally:
            self.versions.end()

    def migrate(self) -> list[str]:
        from models.schema import migrate
        return migrate(self.db)

    def close(self) -> None:
        self.changes.stop()
        self.readiness.close()
        self.denylist.close()
        self.executor.shutdown(wait=True)
        self.rate_limiter.close()
        if self._task_queue is not None:
            self._task_queue.close()
            self._task_queue = None
        if not self.db.is_closed():
            self.db.close()
        if isinstance(self.db, PooledDatabase):
            self.db.close_all()  # every pooled connection, whichever thread last used it
