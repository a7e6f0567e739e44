"""Failure throttle: slows down guessing (client secrets, sign-in passwords, sign-in links).

Only failures are counted, never successes, in fixed windows aligned to the clock (as the
request limiter does). Three counters per failure:

- the subject (`("client", client_id)`, `("account", email)`, ...) across all addresses: catches
  guessing spread over many addresses;
- the address (`("address", ip)`) across all subjects: catches one address trying many subjects;
- the pair (subject, address): the attacker's own address for that subject.

A failed attempt is refused (`Throttled`, 429 + Retry-After) while any of its counters is over
its limit, from any address: no address is exempt. Where the secret is a machine's (client
secrets), the caller checks the secret first and consults the throttle only when it is wrong, so
the right secret is never refused (from a new host too) while guessing is counted and refused
(`oauth.clients`). Where people type it (console passwords), the caller checks the throttle
first: a locked account refuses even the right password until its window ends.

Counts live in Redis when SVC_REDIS_URL is set (all `serve` processes share them), else in this
process's memory. The interface is synchronous: domain code calls it from `Runtime.run`'s pool.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Callable

from ratelimit.limiter import RateLimiterUnavailable, window_of
from ratelimit.policy import Limit

Key = tuple  # e.g. ("client", "abc"), ("address", "203.0.113.9")


class Throttled(Exception):
    """Too many failures: refuse the attempt without checking it; retry after `retry_after` s."""

    def __init__(self, key: Key, retry_after: int):
        super().__init__(f"too many failed attempts for {key[0]}; retry after {retry_after} s")
        self.key = key
        self.retry_after = retry_after


@dataclass(frozen=True)
class FailurePolicy:
    subject: Limit = Limit(10, 300)    # failures per subject (and per subject+address) per window
    address: Limit = Limit(50, 300)    # failures per address, all subjects, per window


def _text(key: Key) -> str:
    # `:` separates parts in Redis keys; escape it inside values (IPv6 addresses contain it).
    return ":".join(str(part).replace("%", "%25").replace(":", "%3A") for part in key)


class _MemoryStore:
    """Counters in this process (the embedded default)."""

    PRUNE_AT = 10000

    def __init__(self):
        self._counts: dict[str, tuple[int, float]] = {}  # key -> (count, expires_at)
        self._lock = threading.Lock()
        # Size at which the table is next pruned: twice what a prune kept, so a table of live
        # entries is scanned again only after it doubled, not on every attempt (amortised O(1)).
        self._prune_counts_at = self.PRUNE_AT

    def _prune(self, now: float) -> None:
        if len(self._counts) > self._prune_counts_at:
            self._counts = {k: v for k, v in self._counts.items() if v[1] > now}
            self._prune_counts_at = max(self.PRUNE_AT, 2 * len(self._counts))

    def counts(self, keys: list[str], now: float) -> list[int]:
        with self._lock:
            return [c if exp > now else 0 for c, exp in (self._counts.get(k, (0, 0.0)) for k in keys)]

    def add(self, keys: list[tuple[str, float]], now: float) -> list[int]:
        with self._lock:
            self._prune(now)
            out = []
            for key, expires_at in keys:
                count, exp = self._counts.get(key, (0, 0.0))
                count = (count if exp > now else 0) + 1
                self._counts[key] = (count, expires_at)
                out.append(count)
            return out


class _RedisStore:
    """The same counters in Redis, so every process of a deployment sees one count."""

    def __init__(self, url: str, timeout: float = 1.0):
        import redis
        self.client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)

    def _call(self, fn):
        from redis.exceptions import RedisError
        try:
            return fn()
        except (RedisError, OSError) as exc:
            raise RateLimiterUnavailable(str(exc)) from exc

    def counts(self, keys: list[str], now: float) -> list[int]:
        values = self._call(lambda: self.client.mget(keys))
        return [int(v or 0) for v in values]

    def add(self, keys: list[tuple[str, float]], now: float) -> list[int]:
        def incr():
            pipe = self.client.pipeline(transaction=True)
            for key, expires_at in keys:
                pipe.incr(key)
                pipe.expire(key, max(1, math.ceil(expires_at - now)) + 1)
            return pipe.execute()[0::2]
        return [int(v) for v in self._call(incr)]


class FailureThrottle:
    """Counts failed attempts of one kind (`name`: "client_auth", "console_signin", ...)."""

    def __init__(self, name: str, policy: FailurePolicy, clock: Callable[[], float],
                 redis_url: str = "", namespace: str = "svc-auth"):
        self.name = name
        self.policy = policy
        self.clock = clock
        self.prefix = f"{namespace}:failures:{name}"
        self.store = _RedisStore(redis_url) if redis_url else _MemoryStore()

    def _keys(self, subject: Key | None, address: str | None, now: float) -> list[tuple[Key, Limit, str, int]]:
        """(what, its limit, store key, seconds until its window ends) of each counter of an attempt."""
        out = []
        if subject is not None:
            index, reset = window_of(self.policy.subject, now)
            out.append((subject, self.policy.subject, f"{self.prefix}:s:{index}:{_text(subject)}", reset))
            if address:
                pair = tuple(subject) + ("address", address)
                out.append((pair, self.policy.subject, f"{self.prefix}:p:{index}:{_text(pair)}", reset))
        if address:
            index, reset = window_of(self.policy.address, now)
            out.append((("address", address), self.policy.address,
                        f"{self.prefix}:a:{index}:{_text(('address', address))}", reset))
        return out

    def check(self, subject: Key | None, address: str | None) -> None:
        """Raise `Throttled` if this attempt must be refused unchecked; count nothing.

        Raises `RateLimiterUnavailable` when the shared store (Redis) cannot be reached."""
        now = self.clock()
        keys = self._keys(subject, address, now)
        counts = self.store.counts([k[2] for k in keys], now)
        for (what, limit, _, reset), count in zip(keys, counts):
            if count >= limit.count:
                raise Throttled(what, reset)

    def failed(self, subject: Key | None, address: str | None) -> list[Key]:
        """Count one failure; returns the counters this failure just locked (audit them)."""
        now = self.clock()
        keys = self._keys(subject, address, now)
        locked = []
        counts = self.store.add([(k[2], now + k[3]) for k in keys], now)
        for (what, limit, _, _), count in zip(keys, counts):
            if count == limit.count:
                locked.append(what)
        return locked


def build_failure_throttle(settings, name: str, policy: FailurePolicy, clock: Callable[[], float]) -> FailureThrottle:
    """Redis-backed when SVC_REDIS_URL is set (shared by every process), else in memory."""
    return FailureThrottle(name, policy, clock, settings.redis_url, settings.redis_namespace)
