"""The Redis limiter: one Lua script per request, so all `serve` processes share one exact count."""
from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from ratelimit.limiter import Decision, RateLimiter, RateLimiterUnavailable, window_of

# KEYS[1] = counter of this client, operation and window; ARGV = limit, window seconds.
# Counts only allowed requests, so a refused burst does not push the window's count past the limit.
HIT_SCRIPT = """
local count = tonumber(redis.call('GET', KEYS[1]) or '0')
if count >= tonumber(ARGV[1]) then
  return {0, count}
end
count = redis.call('INCR', KEYS[1])
if count == 1 then
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]) + 1)
end
return {1, count}
"""


class RedisRateLimiter(RateLimiter):
    def __init__(self, url: str, limits, clock, namespace: str = "svc-auth", timeout: float = 1.0):
        super().__init__(limits, clock)
        self.url = url
        self.namespace = namespace
        self.timeout = timeout
        self._clients: dict[int, tuple] = {}

    def _script(self):
        """A client and registered script for the running event loop (connections are loop-bound)."""
        loop = asyncio.get_running_loop()
        entry = self._clients.get(id(loop))
        if entry is None or entry[0] is not loop:
            client = aioredis.Redis.from_url(self.url, socket_timeout=self.timeout,
                                             socket_connect_timeout=self.timeout)
            entry = (loop, client, client.register_script(HIT_SCRIPT))
            self._clients = {id(loop): entry}  # older loops are gone (tests run one loop per test)
        return entry[2]

    def key(self, client: str, operation: str, window: int) -> str:
        return f"{self.namespace}:ratelimit:{operation}:{client}:{window}"

    async def hit(self, client: str, operation: str) -> Decision:
        limit = self.limit_of(operation)
        index, reset = window_of(limit, self.clock.time())
        try:
            allowed, count = await self._script()(keys=[self.key(client, operation, index)],
                                                  args=[limit.count, limit.seconds])
        except (RedisError, OSError) as exc:
            raise RateLimiterUnavailable(str(exc)) from exc
        return Decision(bool(allowed), limit.count, max(0, limit.count - int(count)), reset)
