"""Quota leased from the shared counters (Redis) and spent in this process's memory (issue 49).

A lease is a block of a counter's quota in one fixed window that Redis has already counted as used
(`ratelimit.redis_limiter.LEASE_SCRIPT`): this process may admit that many requests against the
counter without asking Redis again. Redis never leases past the limit, so all processes together
never admit more than it. What a process leased and did not spend is not given back: it is spent
by that process's next requests of the counter, or expires with the window (or is forfeit when the
counter's limit changes: an operator lowering it is obeyed at the next request). To keep that small:
- a process's first lease of a counter in a window is one request, and each next one twice the
  last (at most MAX_BLOCK): a counter this process serves rarely is counted one request at a time;
- Redis grants at most 1/LEASE_DIVISOR of what is left of the limit (at least one request): near
  the limit, and for any limit under 2 x LEASE_DIVISOR, every request is one Redis call, exact.
So when the shared count reaches the limit, a process holds at most 1/LEASE_DIVISOR of what was
left at its last lease, and admits exactly that many more before it refuses too: the fleet admits
the limit exactly, never more, provided the client's requests keep reaching every process.

What a decision reports (`RateLimit-Remaining`) is the limit minus the shared count as of this
process's last lease of the counter, plus what this process still holds. Exact with one process;
with several, right after a lease of one request (near the limit, small limits) it is at most what
is really left (other processes' unspent leases count as used); in between it is as old as this
process's last lease (at most MAX_BLOCK of its requests ago), so it may not show what the other
processes admitted since. It is never more than the limit less what this process admitted.
"""
from __future__ import annotations

import threading

from ratelimit.policy import Limit

LEASE_DIVISOR = 16
"""Redis grants at most this fraction (1/16) of a counter's remaining quota in one lease."""
MAX_BLOCK = 64
"""The largest lease: a busy counter costs one Redis call per 64 requests of a process."""
PRUNE_SECONDS = 1.0
"""How often passed windows' leases are dropped (on the next lease)."""


class _Lease:
    __slots__ = ("left", "count", "block", "limit", "seconds", "index")

    def __init__(self, limit: Limit, index: int):
        self.left = 0       # requests this process may still admit
        self.count = 0      # the shared count right after this process's last lease
        self.block = 0      # the last block granted (the next asks twice it)
        self.limit = limit.count  # the limit it was leased under: another limit forfeits what is left
        self.seconds, self.index = limit.seconds, index


class Leases:
    """This process's leases, by Redis key (which names its counter and window). Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._held: dict[str, _Lease] = {}
        self._pruned_at = 0.0

    def __len__(self) -> int:
        return len(self._held)

    def spend(self, keys: list[str], limits: list[Limit]):
        """One request against every counter: (counts used as reported, None) when each has quota
        here (then spent from each), else (None, indexes of the counters without); nothing spent."""
        with self._lock:
            held = [self._held.get(key) for key in keys]
            missing = [n for n, lease in enumerate(held)
                       if lease is None or lease.left < 1 or lease.limit != limits[n].count]
            if missing:
                return None, missing
            for lease in held:
                lease.left -= 1
            return [lease.count - lease.left for lease in held], None

    def used(self, keys: list[str]) -> list[int]:
        """Each counter's count as this process reports it (limit - remaining), nothing spent."""
        with self._lock:
            return [(lease.count - lease.left) if lease is not None else 0
                    for lease in (self._held.get(key) for key in keys)]

    def block_for(self, key: str) -> int:
        """The block to ask for: one, then twice the last granted, at most MAX_BLOCK."""
        lease = self._held.get(key)
        return min(MAX_BLOCK, 2 * lease.block) if lease is not None and lease.block else 1

    def add(self, keys: list[str], limits: list[Limit], counts: list[int], blocks: list[int], now: float) -> None:
        """Blocks granted by Redis (`counts`: the shared counts right after)."""
        with self._lock:
            if now - self._pruned_at >= PRUNE_SECONDS:
                self._prune(now)
            for key, limit, count, block in zip(keys, limits, counts, blocks):
                lease = self._held.get(key)
                if lease is None or lease.limit != limit.count:  # a changed limit: what was left is forfeit
                    lease = self._held[key] = _Lease(limit, int(now // limit.seconds))
                lease.left += block
                lease.count = max(lease.count, count)
                lease.block = block

    def _prune(self, now: float) -> None:
        """Under the lock: drop the leases of windows that have passed."""
        self._pruned_at = now
        self._held = {key: lease for key, lease in self._held.items() if lease.index >= int(now // lease.seconds)}
