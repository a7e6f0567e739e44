"""Failure throttle: slows down guessing (client secrets, sign-in passwords, sign-in links).

Only failures are counted, never successes, in a sliding window: each counter keeps the times of
its latest failures, and at most `limit.count` failures are admitted in any `limit.seconds`. A
counter that reached its limit stays locked until the oldest of those `limit.count` failures is
`limit.seconds` old (`Retry-After` says when, in whole seconds); attempts refused meanwhile are not
counted, so they do not extend it. (Fixed windows aligned to the clock, as the request limiter
keeps, let a guesser make twice the limit across a boundary and ended a lock at the boundary,
a second after it began.) Three counters per failure:

- the subject (`("client", client_id)`, `("account", email)`, ...) across all addresses: catches
  guessing spread over many addresses;
- the address (`("address", ip)`) across all subjects: catches one address trying many subjects;
- the pair (subject, address): the attacker's own address for that subject.

A failed attempt is refused (`Throttled`, 429 + Retry-After) while any of its counters is at its
limit, from any address: no address is exempt. Where the secret is a machine's (client secrets),
the caller checks the secret first and consults the throttle only when it is wrong, so the right
secret is never refused (from a new host too) while guessing is counted and refused
(`oauth.clients`). Where people type it (console passwords), the caller checks the throttle
first, and counts the attempt as a failure in the same step (`attempt`, one script in Redis), taken
back when the password was right (`withdraw`): sign-ins whose slow password checks overlap, in one
process or several, cannot get past the limit together. A locked account refuses even the right
password from an untrusted browser until the lock ends; a browser with a device cookie of that
account is held only by its own cookie's counter
(`console.devices`), so a stranger's spray does not lock the developer out.

A subject is counted whether or not it exists (an unknown client_id like a known one), so the
answers never tell which ones exist. Its key is a keyed hash of the subject (HMAC under the
server key, 128 bits): fixed-size whatever was presented, and no presented value in Redis.
Memory stays bounded: a counter keeps at most `limit.count` failure times; Redis keys expire
`limit.seconds` after their latest failure; in memory at most `MAX_ENTRIES` counters are kept,
the least recently failed one dropped first when a spray of distinct subjects or addresses fills
the table (it then forgets its failures: a bigger guessing budget for that spray, never a
lock-out of anyone).

Counts live in Redis when SVC_REDIS_URL is set (all `serve` processes share them: a sorted set of
failure times per counter, changed in one MULTI/EXEC), else in this process's memory. Times are
the process's clock (`runtime.clock`): hosts sharing a Redis keep their clocks in step (NTP), as
everything else here assumes. The interface is synchronous: domain code calls it from
`Runtime.run`'s pool.
"""
from __future__ import annotations

import bisect
import hashlib
import math
import os
import threading
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from ops.addresses import counted_as
from ratelimit.limiter import RateLimiterUnavailable
from ratelimit.policy import Limit

Key = tuple  # e.g. ("client", "abc"), ("address", "203.0.113.9")


class Throttled(Exception):
    """Too many failures: refuse the attempt without checking it; retry after `retry_after` s."""

    def __init__(self, key: Key, retry_after: int):
        super().__init__(f"too many failed attempts for {key[0]}; retry after {retry_after} s")
        self.key = key
        self.retry_after = retry_after


@dataclass(frozen=True)
class Attempt:
    """A failure counted before its attempt was checked (`FailureThrottle.attempt`): its counters
    (store key, limit), the store's handle of it, and the counters it locked."""
    keys: tuple
    token: object
    locked: list


@dataclass(frozen=True)
class FailurePolicy:
    subject: Limit = Limit(10, 300)    # failures per subject (and per subject+address) in any 300 s
    address: Limit = Limit(50, 300)    # failures per address, all subjects, in any 300 s


def _text(key: Key) -> str:
    # `:` separates parts in Redis keys; escape it inside values (IPv6 addresses contain it).
    return ":".join(str(part).replace("%", "%25").replace(":", "%3A") for part in key)


def retry_after(times: list[float], limit: Limit, now: float) -> int | None:
    """Whole seconds until a counter with these recent failure times (ascending, within the
    window) admits a failure again, at least 1; None while it is under its limit."""
    if len(times) < limit.count:
        return None
    return max(1, math.ceil(times[-limit.count] + limit.seconds - now))


class _MemoryStore:
    """Failure times per counter in this process (the embedded default), at most `max_entries` counters."""

    MAX_ENTRIES = 100_000

    def __init__(self, max_entries: int = MAX_ENTRIES):
        # key -> (times ascending, at most the limit's count; when the newest is forgotten),
        # least recently failed first.
        self._logs: OrderedDict[str, tuple[array, float]] = OrderedDict()
        self._lock = threading.Lock()
        self.max_entries = max_entries

    def __len__(self) -> int:
        return len(self._logs)

    def _make_room(self, now: float) -> None:
        """Drop forgotten counters from the old end, then the least recently failed ones past the cap;
        O(1) amortised (each counter is dropped once)."""
        logs = self._logs
        while logs:
            _, forgotten_at = next(iter(logs.values()))
            if forgotten_at > now and len(logs) < self.max_entries:
                break
            logs.popitem(last=False)

    def recent(self, keys: list[tuple[str, Limit]], now: float) -> list[list[float]]:
        """Each counter's failure times within its window, ascending."""
        with self._lock:
            return self._recent(keys, now)

    def _recent(self, keys: list[tuple[str, Limit]], now: float) -> list[list[float]]:
        out = []
        for key, limit in keys:
            times = self._logs.get(key, (array("d"), 0.0))[0]
            out.append(list(times[bisect.bisect_right(times, now - limit.seconds):]))
        return out

    def add(self, keys: list[tuple[str, Limit]], now: float) -> list[int]:
        """Count a failure at `now` in each counter; returns each one's failures within its window."""
        with self._lock:
            return self._add(keys, now)

    def _add(self, keys: list[tuple[str, Limit]], now: float) -> list[int]:
        out = []
        for key, limit in keys:
            times, _ = self._logs.pop(key, (array("d"), 0.0))
            self._make_room(now)
            del times[:bisect.bisect_right(times, now - limit.seconds)]
            bisect.insort(times, now)
            out.append(len(times))
            del times[:-limit.count]
            self._logs[key] = (times, times[-1] + limit.seconds)
        return out

    def claim(self, keys: list[tuple[str, Limit]], now: float) -> tuple[list[int] | None, list[float | None], float]:
        """At once: when no counter is at its limit, a failure counted at `now` in each (`add`'s
        counts); else nothing counted (None), and the time of each locked counter's oldest failure
        of the `limit.count` newest (None for the others). The token `discard` takes: `now`."""
        with self._lock:
            logs = self._recent(keys, now)
            oldest = [times[-limit.count] if len(times) >= limit.count else None
                      for times, (_, limit) in zip(logs, keys)]
            if any(t is not None for t in oldest):
                return None, oldest, now
            return self._add(keys, now), oldest, now

    def discard(self, keys: list[tuple[str, Limit]], token: float) -> None:
        """Forget one failure counted at `token` in each counter (`claim`'s, for an attempt that
        succeeded); one already dropped (trimmed, or its counter forgotten) is left so."""
        with self._lock:
            for key, limit in keys:
                entry = self._logs.get(key)
                times = entry[0] if entry is not None else array("d")
                index = bisect.bisect_left(times, token)
                if index == len(times) or times[index] != token:
                    continue
                del times[index]
                if times:
                    self._logs[key] = (times, times[-1] + limit.seconds)
                else:
                    del self._logs[key]


# `claim`: KEYS = an attempt's counters; ARGV[1] = now (a score), ARGV[2] = the attempt's member, then
# per counter: its window's start, exclusive ("(t"), the same inclusive, its limit's count, its TTL.
# All or nothing: when a counter holds `count` failures within its window, nothing is counted and
# {0, index, score of its count-th newest, ...} is returned; else the failure is counted in each
# counter as `add` counts it, and {1, each counter's count} returned.
CLAIM_SCRIPT = """
local locked = {0}
for i = 1, #KEYS do
  local arg = 2 + 4 * (i - 1)
  local nth = redis.call('ZREVRANGEBYSCORE', KEYS[i], '+inf', ARGV[arg + 1], 'WITHSCORES',
                         'LIMIT', tonumber(ARGV[arg + 3]) - 1, 1)
  if #nth > 0 then
    table.insert(locked, i)
    table.insert(locked, nth[2])
  end
end
if #locked > 1 then
  return locked
end
local counts = {1}
for i = 1, #KEYS do
  local arg = 2 + 4 * (i - 1)
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', ARGV[arg + 2])
  redis.call('ZADD', KEYS[i], ARGV[1], ARGV[2])
  table.insert(counts, redis.call('ZCARD', KEYS[i]))
  redis.call('ZREMRANGEBYRANK', KEYS[i], 0, -tonumber(ARGV[arg + 3]) - 1)
  redis.call('EXPIRE', KEYS[i], tonumber(ARGV[arg + 4]))
end
return counts
"""


class _RedisStore:
    """The same logs in Redis (a sorted set of failure times per counter), so every process of a
    deployment sees one count."""

    def __init__(self, url: str, timeout: float = 1.0):
        import redis
        self.client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        self._claim = self.client.register_script(CLAIM_SCRIPT)

    def _call(self, fn):
        from redis.exceptions import RedisError
        try:
            return fn()
        except (RedisError, OSError) as exc:
            raise RateLimiterUnavailable(str(exc)) from exc

    def recent(self, keys: list[tuple[str, Limit]], now: float) -> list[list[float]]:
        def read():
            pipe = self.client.pipeline(transaction=True)
            for key, limit in keys:
                pipe.zrevrangebyscore(key, "+inf", f"({now - limit.seconds!r}", start=0, num=limit.count,
                                      withscores=True)
            return pipe.execute()
        return [sorted(score for _, score in entries) for entries in self._call(read)]

    def add(self, keys: list[tuple[str, Limit]], now: float) -> list[int]:
        def count():
            # One MULTI/EXEC per failure: forget what left the window, add this failure (a member
            # unique to it: two in the same microsecond both count), count, keep the newest
            # `limit.count`, expire when the newest leaves the window.
            member = f"{now!r}:{os.urandom(8).hex()}"
            pipe = self.client.pipeline(transaction=True)
            for key, limit in keys:
                pipe.zremrangebyscore(key, "-inf", repr(now - limit.seconds))
                pipe.zadd(key, {member: now})
                pipe.zcard(key)
                pipe.zremrangebyrank(key, 0, -limit.count - 1)
                pipe.expire(key, limit.seconds + 1)
            return pipe.execute()[2::5]
        return [int(n) for n in self._call(count)]

    def claim(self, keys: list[tuple[str, Limit]], now: float) -> tuple[list[int] | None, list[float | None], str]:
        """`_MemoryStore.claim` in one script (`CLAIM_SCRIPT`): every process sees it whole. The
        token `discard` takes: the failure's member."""
        member = f"{now!r}:{os.urandom(8).hex()}"
        args = [repr(now), member]
        for _, limit in keys:
            args += [f"({now - limit.seconds!r}", repr(now - limit.seconds), limit.count, limit.seconds + 1]
        answer = self._call(lambda: self._claim(keys=[key for key, _ in keys], args=args))
        if int(answer[0]):
            return [int(n) for n in answer[1:]], [None] * len(keys), member
        oldest: list[float | None] = [None] * len(keys)
        for index, score in zip(answer[1::2], answer[2::2]):
            oldest[int(index) - 1] = float(score)
        return None, oldest, member

    def discard(self, keys: list[tuple[str, Limit]], token: str) -> None:
        def remove():
            pipe = self.client.pipeline(transaction=True)
            for key, _ in keys:
                pipe.zrem(key, token)
            pipe.execute()
        self._call(remove)


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

    def _keys(self, subject: Key | None, address: str | None) -> list[tuple[Key, Limit, str]]:
        """(what, its limit, store key) of each counter of an attempt (an IPv6 address counted by
        its /64: `ops.addresses`)."""
        address = counted_as(address) if address else address
        out = []
        if subject is not None:
            hashed = self._subject_key(subject)
            out.append((subject, self.policy.subject, f"{self.prefix}:s:{hashed}"))
            if address:
                pair = tuple(subject) + ("address", address)
                out.append((pair, self.policy.subject, f"{self.prefix}:p:{hashed}:{_text(('address', address))}"))
        if address:
            out.append((("address", address), self.policy.address, f"{self.prefix}:a:{_text(('address', address))}"))
        return out

    def check(self, subject: Key | None, address: str | None) -> None:
        """Raise `Throttled` if this attempt must be refused unchecked; count nothing. Its
        `retry_after` is the longest wait among the locked counters.

        Raises `RateLimiterUnavailable` when the shared store (Redis) cannot be reached."""
        now = self.clock()
        keys = self._keys(subject, address)
        logs = self.store.recent([(k[2], k[1]) for k in keys], now)
        locked = [(wait, what) for (what, limit, _), times in zip(keys, logs)
                  if (wait := retry_after(times, limit, now)) is not None]
        if locked:
            wait, what = max(locked, key=lambda lock: lock[0])
            raise Throttled(what, wait)

    def attempt(self, subject: Key | None, address: str | None) -> Attempt:
        """An attempt counted as a failure before it is checked, at once with `check`: `Throttled`
        (nothing counted) while one of its counters is at its limit, else its failure counted in
        each, so attempts checked together (a slow password hash, several processes) cannot pass
        the limit. `withdraw` takes it back when it succeeds. Its `locked`: the counters it locked.

        Raises `RateLimiterUnavailable` when the shared store (Redis) cannot be reached."""
        now = self.clock()
        keys = self._keys(subject, address)
        stored = [(k[2], k[1]) for k in keys]
        counts, oldest, token = self.store.claim(stored, now)
        if counts is None:
            wait, what = max(((max(1, math.ceil(t + limit.seconds - now)), what)
                              for (what, limit, _), t in zip(keys, oldest) if t is not None), key=lambda lock: lock[0])
            raise Throttled(what, wait)
        return Attempt(tuple(stored), token, [what for (what, limit, _), count in zip(keys, counts)
                                              if count == limit.count])

    def withdraw(self, attempt: Attempt) -> None:
        """Take back an `attempt`'s failure: it succeeded (or was never answered)."""
        self.store.discard(list(attempt.keys), attempt.token)

    def failed(self, subject: Key | None, address: str | None) -> list[Key]:
        """Count one failure; returns the counters this failure just locked (audit them)."""
        keys = self._keys(subject, address)
        counts = self.store.add([(k[2], k[1]) for k in keys], self.clock())
        return [what for (what, limit, _), count in zip(keys, counts) if count == limit.count]


def build_failure_throttle(settings, name: str, policy: FailurePolicy, clock: Callable[[], float],
                           hasher=None) -> FailureThrottle:
    """Redis-backed when SVC_REDIS_URL is set (shared by every process), else in memory; subjects
    keyed by `hasher` (the runtime's, under SVC_HMAC_KEY)."""
    return FailureThrottle(name, policy, clock, settings.redis_url, settings.redis_namespace, hasher)
