"""The limiter interface and its in-memory implementation (the embedded default, one process)."""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from ratelimit.policy import Limit


class RateLimiterUnavailable(Exception):
    """The shared counter store (Redis) cannot be reached; the caller must refuse, not pass traffic."""


@dataclass(frozen=True)
class Decision:
    allowed: bool
    limit: int
    remaining: int
    reset: int          # seconds until the window ends and the count starts again
    key: str = ""       # hit_all: the counter this decision reports (the refusing one when refused)

    def headers(self) -> dict[str, str]:
        """`RateLimit-*` headers (IETF draft) for every limited response; `Retry-After` when refused."""
        headers = {"RateLimit-Limit": str(self.limit), "RateLimit-Remaining": str(self.remaining),
                   "RateLimit-Reset": str(self.reset)}
        if not self.allowed:
            headers["Retry-After"] = str(self.reset)
        return headers


def window_of(limit: Limit, now: float) -> tuple[int, int]:
    """(index of the fixed window containing `now`, whole seconds until it ends, at least 1)."""
    index = int(now // limit.seconds)
    reset = max(1, math.ceil((index + 1) * limit.seconds - now))
    return index, reset


def binding(keys: list[str], counts: list[int], limits: list[Limit], resets: list[int], allowed: bool) -> Decision:
    """The decision of several counters as one: when refused, the exhausted counter that frees
    last; when allowed, the counter with the fewest requests left (what the headers report)."""
    left = [max(0, limit.count - count) for count, limit in zip(counts, limits)]
    if allowed:
        i = min(range(len(limits)), key=lambda n: (left[n], -resets[n]))
    else:
        i = max((n for n in range(len(limits)) if counts[n] >= limits[n].count), key=lambda n: resets[n])
    return Decision(allowed, limits[i].count, left[i], resets[i], keys[i])


class RateLimiter:
    """Counts one request of `client` for `operation` and says whether it is allowed."""

    def __init__(self, limits: dict[str, Limit], clock):
        self.limits = limits
        self.clock = clock

    def limit_of(self, operation: str) -> Limit:
        return self.limits[operation]

    async def hit(self, client: str, operation: str) -> Decision:
        raise NotImplementedError

    async def hit_all(self, counters: list[tuple[str, Limit]]) -> Decision:
        """One request against several counters (`(key, limit)`), atomically: allowed, and
        counted in every counter, only when each is under its limit; a refusal counts nowhere."""
        raise NotImplementedError

    def close(self) -> None:
        """Release connections (a no-op for the in-memory limiter)."""


class MemoryRateLimiter(RateLimiter):
    """Fixed-window counters in this process's memory; old windows are dropped as they pass."""

    def __init__(self, limits: dict[str, Limit], clock):
        super().__init__(limits, clock)
        self._counts: dict[tuple[str, str, int], int] = {}
        self._lock = threading.Lock()
        self._keyed: dict[tuple[str, int, int], int] = {}  # hit_all: (key, window seconds, index) -> count

    async def hit(self, client: str, operation: str) -> Decision:
        limit = self.limit_of(operation)
        index, reset = window_of(limit, self.clock.time())
        key = (client, operation, index)
        with self._lock:
            count = self._counts.get(key, 0)
            if count < limit.count:
                count += 1
                self._counts[key] = count
                allowed = True
            else:
                allowed = False
            if len(self._counts) > 10000:
                self._counts = {k: v for k, v in self._counts.items()
                                if k[2] >= int(self.clock.time() // self.limit_of(k[1]).seconds)}
        return Decision(allowed, limit.count, max(0, limit.count - count), reset)

    async def hit_all(self, counters: list[tuple[str, Limit]]) -> Decision:
        now = self.clock.time()
        windows = [window_of(limit, now) for _, limit in counters]
        keys = [(key, limit.seconds, index) for (key, limit), (index, _) in zip(counters, windows)]
        limits = [limit for _, limit in counters]
        with self._lock:
            counts = [self._keyed.get(key, 0) for key in keys]
            allowed = all(count < limit.count for count, limit in zip(counts, limits))
            if allowed:
                counts = [count + 1 for count in counts]
                self._keyed.update(zip(keys, counts))
            if len(self._keyed) > 10000:  # drop windows that have passed
                self._keyed = {k: v for k, v in self._keyed.items() if k[2] >= int(now // k[1])}
        return binding([key for key, _ in counters], counts, limits, [reset for _, reset in windows], allowed)
