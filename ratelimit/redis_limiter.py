"""The Redis limiter: one Lua script per decision, so all `serve` processes share one exact count.

`hit_all_now` (the FHIR API's, on its pool) leases quota instead of counting each request in Redis
(issue 49): one script call takes a block of each counter's remaining quota for this process
(`LEASE_SCRIPT`: counted in Redis as used at once), and the process spends it in memory
(`ratelimit.leases.Leases`). Redis never hands out more than the limit, so the processes together
never admit more; blocks shrink as the quota runs out (`LEASE_DIVISOR`) and start at one request
per counter and window in each process, doubling while it keeps spending them (`MAX_BLOCK` at
most), so a small limit is counted one request at a time, exactly as before.
"""
from __future__ import annotations

import asyncio
import threading

import redis
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from ratelimit.leases import LEASE_DIVISOR, Leases
from ratelimit.limiter import Decision, RateLimiter, RateLimiterUnavailable, binding, window_of
from ratelimit.policy import Limit

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

# hit_all: KEYS = one counter per limit of the request; ARGV = limit and window seconds of each, in
# turn. All or nothing: counted in every counter only when each is under its limit.
HIT_ALL_SCRIPT = """
local counts = {}
local allowed = 1
for i = 1, #KEYS do
  counts[i] = tonumber(redis.call('GET', KEYS[i]) or '0')
  if counts[i] >= tonumber(ARGV[2 * i - 1]) then
    allowed = 0
  end
end
if allowed == 1 then
  for i = 1, #KEYS do
    counts[i] = redis.call('INCR', KEYS[i])
    if counts[i] == 1 then
      redis.call('EXPIRE', KEYS[i], tonumber(ARGV[2 * i]) + 1)
    end
  end
end
table.insert(counts, 1, allowed)
return counts
"""

# hit_all_now's leases: KEYS = the counters this process holds no quota of; ARGV = limit, window
# seconds and the block this process asks for, of each in turn, then LEASE_DIVISOR. All or nothing,
# as HIT_ALL_SCRIPT: when any counter is at its limit nothing is taken. Otherwise each counter gives
# min(asked, floor(left / divisor)), at least 1, and counts it as used at once.
LEASE_SCRIPT = """
local counts = {}
local allowed = 1
for i = 1, #KEYS do
  counts[i] = tonumber(redis.call('GET', KEYS[i]) or '0')
  if counts[i] >= tonumber(ARGV[3 * i - 2]) then
    allowed = 0
  end
end
local blocks = {}
if allowed == 1 then
  local divisor = tonumber(ARGV[3 * #KEYS + 1])
  for i = 1, #KEYS do
    local block = math.floor((tonumber(ARGV[3 * i - 2]) - counts[i]) / divisor)
    if block > tonumber(ARGV[3 * i]) then block = tonumber(ARGV[3 * i]) end
    if block < 1 then block = 1 end
    local before = counts[i]
    counts[i] = redis.call('INCRBY', KEYS[i], block)
    if before == 0 then
      redis.call('EXPIRE', KEYS[i], tonumber(ARGV[3 * i - 1]) + 1)
    end
    blocks[i] = block
  end
end
local reply = {allowed}
for i = 1, #KEYS do table.insert(reply, counts[i]) end
for i = 1, #blocks do table.insert(reply, blocks[i]) end
return reply
"""


class RedisRateLimiter(RateLimiter):
    def __init__(self, url: str, limits, clock, namespace: str = "svc-auth", timeout: float = 1.0):
        super().__init__(limits, clock)
        self.url = url
        self.namespace = namespace
        self.timeout = timeout
        self._clients: dict[int, tuple] = {}
        self._blocking = None  # (client, lease script) for pool threads: `hit_all_now`
        self.leases = Leases()  # this process's unspent quota, per counter and window
        self._blocking_lock = threading.Lock()

    def _script(self):
        """A client and registered script for the running event loop (connections are loop-bound)."""
        loop = asyncio.get_running_loop()
        entry = self._clients.get(id(loop))
        if entry is None or entry[0] is not loop:
            client = aioredis.Redis.from_url(self.url, socket_timeout=self.timeout,
                                             socket_connect_timeout=self.timeout)
            entry = (loop, client, client.register_script(HIT_SCRIPT), client.register_script(HIT_ALL_SCRIPT))
            self._clients = {id(loop): entry}  # older loops are gone (tests run one loop per test)
        return entry[2]

    def _all_script(self):
        self._script()
        return self._clients[id(asyncio.get_running_loop())][3]

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

    def _counters(self, counters: list[tuple[str, Limit]]):
        """(Redis keys, script arguments, the windows' resets) of one `hit_all`."""
        now = self.clock.time()
        windows = [window_of(limit, now) for _, limit in counters]
        keys = [f"{self.namespace}:ratelimit:{key}:{limit.seconds}:{index}"
                for (key, limit), (index, _) in zip(counters, windows)]
        return keys, [n for _, limit in counters for n in (limit.count, limit.seconds)], [reset for _, reset in windows]

    @staticmethod
    def _decision(counters: list[tuple[str, Limit]], resets: list[int], reply) -> Decision:
        allowed, *counts = reply
        return binding([key for key, _ in counters], [int(c) for c in counts], [limit for _, limit in counters],
                       resets, bool(allowed))

    async def hit_all(self, counters: list[tuple[str, Limit]]) -> Decision:
        keys, args, resets = self._counters(counters)
        try:
            reply = await self._all_script()(keys=keys, args=args)
        except (RedisError, OSError) as exc:
            raise RateLimiterUnavailable(str(exc)) from exc
        return self._decision(counters, resets, reply)

    def hit_all_now(self, counters: list[tuple[str, Limit]]) -> Decision:
        """`hit_all`, spending this process's leased quota: one Redis call only when a counter has
        none left here (`ratelimit.leases`)."""
        keys, _, resets = self._counters(counters)
        limits = [limit for _, limit in counters]
        now = self.clock.time()
        while True:
            spent, missing = self.leases.spend(keys, limits)
            if spent is not None:
                return binding([key for key, _ in counters], spent, limits, resets, True)
            asks = [self.leases.block_for(keys[n]) for n in missing]
            try:
                reply = self._blocking_script()(
                    keys=[keys[n] for n in missing],
                    args=[v for n, ask in zip(missing, asks) for v in (limits[n].count, limits[n].seconds, ask)]
                    + [LEASE_DIVISOR])
            except (RedisError, OSError) as exc:
                raise RateLimiterUnavailable(str(exc)) from exc
            allowed, counts, blocks = int(reply[0]), [int(c) for c in reply[1:1 + len(missing)]], reply[1 + len(missing):]
            if not allowed:
                used = self.leases.used(keys)
                for n, count in zip(missing, counts):
                    used[n] = count
                return binding([key for key, _ in counters], used, limits, resets, False)
            self.leases.add([keys[n] for n in missing], [limits[n] for n in missing], counts,
                            [int(b) for b in blocks], now)
            # spend again: another thread may have spent what this call leased; then lease again

    def _blocking_script(self):
        """The blocking client's lease script (redis-py's client is thread-safe: a connection pool)."""
        with self._blocking_lock:
            if self._blocking is None:
                client = redis.Redis.from_url(self.url, socket_timeout=self.timeout, socket_connect_timeout=self.timeout)
                self._blocking = (client, client.register_script(LEASE_SCRIPT))
            return self._blocking[1]

    def close(self) -> None:
        """Close the blocking client (the IOLoop's clients close with their loop)."""
        with self._blocking_lock:
            if self._blocking is not None:
                self._blocking[0].close()
                self._blocking = None
