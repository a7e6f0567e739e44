"""Throttling of failed console sign-ins: after `MAX_FAILURES` failures for one account, or from
one source address, within `WINDOW_SECONDS`, further attempts are refused until the window ends.

Only failures count. The window opens at the first failure of a key and lasts `WINDOW_SECONDS`
(one fixed window per key). In memory for one process (the embedded default) or in Redis for
every `serve` process (SVC_REDIS_URL). Synchronous: callers run it through `Runtime.run`.

The token endpoint's failure throttle (`ratelimit/failures.py`, issue 12) follows the same rule;
this module's interface (`retry_after`, `failed`, `succeeded`) is what the console needs, so
moving the console onto that mechanism replaces only `build_signin_throttle`.
"""
from __future__ import annotations

import hashlib
import math
import threading

from ratelimit.limiter import RateLimiterUnavailable

MAX_FAILURES = 5
WINDOW_SECONDS = 15 * 60


def account_key(email: str) -> str:
    """The throttle key of an account (hashed: no e-mail addresses in Redis)."""
    return "account:" + hashlib.sha256((email or "").strip().lower().encode()).hexdigest()[:32]


def address_key(address: str) -> str:
    return "address:" + (address or "unknown")


class SignInThrottle:
    """`retry_after(keys)` -> seconds to wait (0: may try), `failed(keys)`, `succeeded(key)`."""

    def __init__(self, clock, max_failures: int = MAX_FAILURES, window: int = WINDOW_SECONDS):
        self.clock = clock
        self.max_failures = max_failures
        self.window = window

    def retry_after(self, keys) -> int:
        raise NotImplementedError

    def failed(self, keys) -> None:
        raise NotImplementedError

    def succeeded(self, key: str) -> None:
        raise NotImplementedError


class MemorySignInThrottle(SignInThrottle):
    def __init__(self, clock, **limits):
        super().__init__(clock, **limits)
        self._failures: dict[str, tuple[float, int]] = {}  # key -> (window end, failures)
        self._lock = threading.Lock()

    def _current(self, key: str, now: float) -> tuple[float, int]:
        end, count = self._failures.get(key, (0.0, 0))
        return (end, count) if end > now else (0.0, 0)

    def retry_after(self, keys) -> int:
        now = self.clock.time()
        with self._lock:
            waits = [end - now for end, count in (self._current(k, now) for k in keys) if count >= self.max_failures]
        return max(1, math.ceil(max(waits))) if waits else 0

    def failed(self, keys) -> None:
        now = self.clock.time()
        with self._lock:
            for key in keys:
                end, count = self._current(key, now)
                self._failures[key] = (end or now + self.window, count + 1)
            if len(self._failures) > 10000:
                self._failures = {k: v for k, v in self._failures.items() if v[0] > now}

    def succeeded(self, key: str) -> None:
        with self._lock:
            self._failures.pop(key, None)


class RedisSignInThrottle(SignInThrottle):
    """Counters `INCR`ed in Redis; the first failure of a key sets its expiry (the window)."""

    def __init__(self, clock, url: str, namespace: str, timeout: float = 1.0, **limits):
        super().__init__(clock, **limits)
        import redis
        self._redis = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        self.namespace = namespace

    def _key(self, key: str) -> str:
        return f"{self.namespace}:console-signin:{key}"

    def _call(self, fn):
        from redis.exceptions import RedisError
        try:
            return fn()
        except (RedisError, OSError) as exc:
            raise RateLimiterUnavailable(str(exc)) from exc

    def retry_after(self, keys) -> int:
        def read():
            pipe = self._redis.pipeline(transaction=False)
            for key in keys:
                pipe.get(self._key(key))
                pipe.pttl(self._key(key))
            return pipe.execute()
        values = self._call(read)
        waits = [ttl for count, ttl in zip(values[::2], values[1::2])
                 if count is not None and int(count) >= self.max_failures and ttl and ttl > 0]
        return max(1, math.ceil(max(waits) / 1000)) if waits else 0

    def failed(self, keys) -> None:
        def write():
            pipe = self._redis.pipeline(transaction=True)
            for key in keys:
                pipe.incr(self._key(key))
                pipe.expire(self._key(key), self.window, nx=True)
            pipe.execute()
        self._call(write)

    def succeeded(self, key: str) -> None:
        self._call(lambda: self._redis.delete(self._key(key)))


def build_signin_throttle(settings, clock) -> SignInThrottle:
    """Redis when SVC_REDIS_URL is set (shared by every process), else this process's memory."""
    if settings.redis_url:
        return RedisSignInThrottle(clock, settings.redis_url, settings.redis_namespace)
    return MemorySignInThrottle(clock)
