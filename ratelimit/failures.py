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

A subject is counted whether or not it exists (an unknown client_id like a known one), so the
answers never tell which ones exist. Its key is a keyed hash of the subject (HMAC under the
server key, 128 bits): fixed-size whatever was presented, and no presented value in Redis.
Memory stays bounded: Redis keys expire with their window; in memory at most `MAX_ENTRIES`
counters are kept, the least recently failed one dropped first when a spray of distinct
subjects or addresses fills the table (it then forgets its oldest counts: a bigger guessing
budget for that spray, never a lock-out of anyone).

Counts live in Redis when SVC_REDIS_URL is set (all `serve` processes share them), else in this
process's memory. The interface is synchronous: domain code calls it from `Runtime.run`'s pool.
"""
from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from ops.addresses import counted_as
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
    """Counters in this process (the embedded default), at most `max_entries` of them."""

    MAX_ENTRIES = 100_000

    def __init__(self, max_entries: int = MAX_ENTRIES):
        # key -> (count, expires_at), least recently failed first.
        self._counts: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self._lock = threading.Lock()
        self.max_entries = max_entries

    def __len__(self) -> int:
        return len(self._counts)

    def _make_room(self, now: float) -> None:
        """Drop expired counters from the old end, then the least recently failed ones past the cap;
        O(1) amortised (each counter is dropped once)."""
        counts = self._counts
        while counts:
            key, (_, expires_at) = next(iter(counts.items()))
            if expires_at > now and len(counts) < self.max_entries:
                break
            counts.popitem(last=False)

    def counts(self, keys: list[str], now: float) -> list[int]:
        with self._lock:
            return [c if exp > now else 0 for c, exp in (self._counts.get(k, (0, 0.0)) for k in keys)]

    def add(self, keys: list[tuple[str, float]], now: float) -> list[int]:
        with self._lock:
            out = []
            for key, expires_at in keys:
                count, exp = self._counts.pop(key, (0, 0.0))
                self._make_room(now)
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
                 redis_url: str = "", namespace: str = "svc-auth", hasher=None):
        self.name = name
        self.policy = policy
        self.clock = clock
        self.prefix = f"{namespace}:failures:{name}"
        self.store = _RedisStore(redis_url) if redis_url else _MemoryStore()
        self._hasher = hasher  # keys.secrets.SecretHasher (the server key); None: plain SHA-256

    def _subject_key(self, subject: Key) -> str:
        """A fixed-size keyed hash of the subject: its counter's name in the store."""
        text = f"{self.name}\x00{_text(subject)}"
        if self._hasher is not None:
            return self._hasher.sign(f"failure-throttle\x00{text}")[:22]
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]

    def _keys(self, subject: Key | None, address: str | None, now: float) -> list[tuple[Key, Limit, str, int]]:
        """(what, its limit, store key, seconds until its window ends) of each counter of an attempt
        (an IPv6 address counted by its /64: `ops.addresses`)."""
        address = counted_as(address) if address else address
        out = []
        if subject is not None:
            index, reset = window_of(self.policy.subject, now)
            hashed = self._subject_key(subject)
            out.append((subject, self.policy.subject, f"{self.prefix}:s:{index}:{hashed}", reset))
            if address:
                pair = tuple(subject) + ("address", address)
                out.append((pair, self.policy.subject, f"{self.prefix}:p:{index}:{hashed}:{_text(('address', address))}",
                            reset))
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


def build_failure_throttle(settings, name: str, policy: FailurePolicy, clock: Callable[[], float],
                           hasher=None) -> FailureThrottle:
    """Redis-backed when SVC_REDIS_URL is set (shared by every process), else in memory; subjects
    keyed by `hasher` (the runtime's, under SVC_HMAC_KEY)."""
    return FailureThrottle(name, policy, clock, settings.redis_url, settings.redis_namespace, hasher)
