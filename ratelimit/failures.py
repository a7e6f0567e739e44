"""Failure throttle: slows down guessing (client secrets, sign-in passwords, sign-in links).

Only failures are counted, never successes, in fixed windows aligned to the clock (as the
request limiter does). Three counters per failure:

- the subject (`("client", client_id)`, `("account", email)`, ...) across all addresses: catches
  guessing spread over many addresses;
- the address (`("address", ip)`) across all subjects: catches one address trying many subjects;
- the pair (subject, address): the attacker's own address for that subject.

A request is refused (`Throttled`, 429 + Retry-After) while any of its counters is over its
limit, unless its address is *trusted* for the subject: an address becomes trusted for a subject
when a request from it succeeded (`succeeded`, for `trust_seconds`). A trusted address is never
locked out of that subject and its failures there are not counted: it has proved it holds the
secret, so its failures are rotation or configuration noise (during a client-secret rotation an
app tries its old secret first on every call). So the legitimate client with its right secret
keeps working from its own address while an attacker who locked the subject stays locked out.
(Caveat: an attacker behind the very same address as the legitimate client, e.g. a shared NAT,
shares its trust; the secrets' entropy is the defence there, this throttle is the second line.)

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
    trust_seconds: int = 30 * 24 * 3600  # how long a success trusts its address for the subject
    # True (client secrets): a trusted address is never locked out of its subject and its failures
    # there are not counted. False (e.g. passwords typed by people): trust is not used at all, so
    # the subject and pair limits apply to everyone.
    exempt_trusted: bool = True


def _text(key: Key) -> str:
    # `:` separates parts in Redis keys; escape it inside values (IPv6 addresses contain it).
    return ":".join(str(part).replace("%", "%25").replace(":", "%3A") for part in key)


class _MemoryStore:
    """Counters and trust marks in this process (the embedded default)."""

    PRUNE_AT = 10000

    def __init__(self):
        self._counts: dict[str, tuple[int, float]] = {}  # key -> (count, expires_at)
        self._trusted: dict[str, float] = {}
        self._lock = threading.Lock()
        # Sizes at which the tables are next pruned: twice what a prune kept, so a table of live
        # entries is scanned again only after it doubled, not on every attempt (amortised O(1)).
        self._prune_counts_at = self._prune_trusted_at = self.PRUNE_AT

    def _prune(self, now: float) -> None:
        if len(self._counts) > self._prune_counts_at:
            self._counts = {k: v for k, v in self._counts.items() if v[1] > now}
            self._prune_counts_at = max(self.PRUNE_AT, 2 * len(self._counts))
        if len(self._trusted) > self._prune_trusted_at:
            self._trusted = {k: v for k, v in self._trusted.items() if v > now}
            self._prune_trusted_at = max(self.PRUNE_AT, 2 * len(self._trusted))

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

    def trusted(self, key: str, now: float) -> bool:
        with self._lock:
            return self._trusted.get(key, 0.0) > now

    def trust(self, key: str, until: float, now: float) -> None:
        with self._lock:
            self._prune(now)
            self._trusted[key] = until


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

    def trusted(self, key: str, now: float) -> bool:
        return bool(self._call(lambda: self.client.exists(key)))

    def trust(self, key: str, until: float, now: float) -> None:
        self._call(lambda: self.client.set(key, "1", ex=max(1, math.ceil(until - now))))


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

    def _trust_key(self, subject: Key, address: str) -> str:
        return f"{self.prefix}:t:{_text(subject)}:{_text(('address', address))}"

    def check(self, subject: Key | None, address: str | None) -> None:
        """Raise `Throttled` if this attempt must be refused unchecked; count nothing.

        Raises `RateLimiterUnavailable` when the shared store (Redis) cannot be reached."""
        now = self.clock()
        keys = self._keys(subject, address, now)
        counts = self.store.counts([k[2] for k in keys], now)
        trusted = None
        for (what, limit, _, reset), count in zip(keys, counts):
            if count < limit.count:
                continue
            if trusted is None:
                trusted = bool(self.policy.exempt_trusted and subject and address
                               and self.store.trusted(self._trust_key(subject, address), now))
            if trusted:
                return  # under attack from elsewhere (or locked by others' failures); this address proved itself
            raise Throttled(what, reset)

    def failed(self, subject: Key | None, address: str | None) -> list[Key]:
        """Count one failure; returns the counters this failure just locked (audit them)."""
        now = self.clock()
        if self.policy.exempt_trusted and subject is not None and address \
                and self.store.trusted(self._trust_key(subject, address), now):
            return []  # an address that holds the secret (e.g. an app mid-rotation): not guessing
        keys = self._keys(subject, address, now)
        locked = []
        counts = self.store.add([(k[2], now + k[3]) for k in keys], now)
        for (what, limit, _, _), count in zip(keys, counts):
            if count == limit.count:
                locked.append(what)
        return locked

    def succeeded(self, subject: Key, address: str | None) -> None:
        """A success consumes nothing; it trusts this address for the subject."""
        if address and self.policy.exempt_trusted:
            now = self.clock()
            self.store.trust(self._trust_key(subject, address), now + self.policy.trust_seconds, now)


def build_failure_throttle(settings, name: str, policy: FailurePolicy, clock: Callable[[], float]) -> FailureThrottle:
    """Redis-backed when SVC_REDIS_URL is set (shared by every process), else in memory."""
    return FailureThrottle(name, policy, clock, settings.redis_url, settings.redis_namespace)
