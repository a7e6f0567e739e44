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
    last; when allowed, the counter with the fewest requests left (what the headers report).
    Ties go to the first such counter."""
    best = -1
    best_left = best_reset = 0
    for n, limit in enumerate(limits):
        left = limit.count - counts[n]
        if left < 0:
            left = 0
        reset = resets[n]
        if allowed:
            if best < 0 or left < best_left or (left == best_left and reset > best_reset):
                best, best_left, best_reset = n, left, reset
        elif counts[n] >= limit.count and (best < 0 or reset > best_reset):
            best, best_left, best_reset = n, left, reset
    return Decision(allowed, limits[best].count, best_left, best_reset, keys[best])


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

    def hit_all_now(self, counters: list[tuple[str, Limit]]) -> Decision:
        """`hit_all`, blocking: for a request's pool job (the FHIR API counts its request in the
        same job that authenticates and answers it)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release connections (a no-op for the in-memory limiter)."""


class MemoryRateLimiter(RateLimiter):
    """Fixed-window counters in this process's memory, grouped by window (its length and index):
    when a request opens a new window, every window that has passed is dropped whole, so pruning
    costs one look at the few live windows per new window, never a pass over the counters
    (issue 36: the table was rebuilt on every request once 10,000 counters were live)."""

    def __init__(self, limits: dict[str, Limit], clock):
        super().__init__(limits, clock)
        self._lock = threading.Lock()
        # (window seconds, window index) -> {counter key -> count}; `hit` keys are (client,
        # operation) tuples, `hit_all` keys are strings: one table, no collision.
        self._windows: dict[tuple[int, int], dict] = {}

    def __len__(self) -> int:
        """Counters held (of the windows not yet dropped)."""
        with self._lock:
            return sum(len(counters) for counters in self._windows.values())

    def _window(self, seconds: int, index: int, now: float) -> dict:
        """Under the lock: the counters of window (`seconds`, `index`); opening it drops the passed ones."""
        counters = self._windows.get((seconds, index))
        if counters is None:
            for passed in [w for w in self._windows if w[1] < int(now // w[0])]:
                del self._windows[passed]
            counters = self._windows[(seconds, index)] = {}
        return counters

    async def hit(self, client: str, operation: str) -> Decision:
        limit = self.limit_of(operation)
        now = self.clock.time()
        index, reset = window_of(limit, now)
        key = (client, operation)
        with self._lock:
            counters = self._window(limit.seconds, index, now)
            count = counters.get(key, 0)
            allowed = count < limit.count
            if allowed:
                count += 1
                counters[key] = count
        return Decision(allowed, limit.count, max(0, limit.count - count), reset)

    async def hit_all(self, counters: list[tuple[str, Limit]]) -> Decision:
        return self.hit_all_now(counters)

    def hit_all_now(self, counters: list[tuple[str, Limit]]) -> Decision:
        now = self.clock.time()
        keys, limits, resets, tables, counts = [], [], [], [], []
        allowed = True
        with self._lock:
            for key, limit in counters:
                index, reset = window_of(limit, now)
                table = self._window(limit.seconds, index, now)
                count = table.get(key, 0)
                allowed = allowed and count < limit.count
                keys.append(key)
                limits.append(limit)
                resets.append(reset)
                tables.append(table)
                counts.append(count)
            if allowed:
                for n, table in enumerate(tables):
                    counts[n] += 1
                    table[keys[n]] = counts[n]
        return binding(keys, counts, limits, resets, allowed)
