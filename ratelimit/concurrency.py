"""A cap on concurrent work per key (a clinic) in this process: at most `limit` at once, the rest
refused at once (never queued, so a busy key holds no more of the process's threads than its cap)."""
from __future__ import annotations

import threading


class ConcurrencyCap:
    def __init__(self, limit: int):
        self.limit = limit
        self._active: dict[str, int] = {}  # only keys with work in progress: bounded by the pool
        self._lock = threading.Lock()

    def try_acquire(self, key: str) -> bool:
        """Take one of `key`'s slots; False (nothing taken) when all `limit` are in use."""
        with self._lock:
            active = self._active.get(key, 0)
            if active >= self.limit:
                return False
            self._active[key] = active + 1
            return True

    def release(self, key: str) -> None:
        with self._lock:
            active = self._active.get(key, 0) - 1
            if active > 0:
                self._active[key] = active
            else:
                self._active.pop(key, None)

    def active(self, key: str) -> int:
        return self._active.get(key, 0)
