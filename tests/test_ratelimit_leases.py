"""Issue 49: the FHIR API's limiter leases blocks of quota from Redis (`ratelimit.leases`), over a
real Redis with two limiters, each as one `serve` process holds it: never more than the limit,
all of it usable, small limits counted one request at a time, a refusal counting nowhere."""
from __future__ import annotations

import pytest
import redis

from helpers.environment import REDIS_URL
from ratelimit.leases import MAX_BLOCK
from ratelimit.policy import Limit
from ratelimit.redis_limiter import RedisRateLimiter


class Clock:
    def __init__(self, now: float):
        self.now = now

    def time(self) -> float:
        return self.now


@pytest.fixture
def fleet(redis_namespace):
    """Two processes' limiters on one Redis namespace, one clock."""
    clock = Clock(1_000_000.0)
    limiters = [RedisRateLimiter(REDIS_URL, {}, clock, namespace=redis_namespace) for _ in range(2)]
    yield clock, limiters
    for limiter in limiters:
        limiter.close()


def shared(namespace: str, key: str) -> int:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        values = [int(client.get(k)) for k in client.scan_iter(f"{namespace}:ratelimit:{key}:*")]
    finally:
        client.close()
    return sum(values)


def test_a_small_limit_is_counted_one_request_at_a_time_across_processes(fleet, redis_namespace):
    _, (a, b) = fleet
    counters = [("t", Limit(20, 60))]
    for n in range(20):
        decision = (a, b)[n % 2].hit_all_now(counters)
        assert decision.allowed and decision.remaining == 19 - n
        assert shared(redis_namespace, "t") == n + 1  # nothing held unspent
    assert not a.hit_all_now(counters).allowed and not b.hit_all_now(counters).allowed
    assert shared(redis_namespace, "t") == 20


def test_a_large_limit_is_leased_in_blocks_never_exceeded_and_fully_used(fleet, redis_namespace):
    clock, (a, b) = fleet
    limit = 1000
    counters = [("t", Limit(limit, 60))]
    for n in range(100):
        decision = a.hit_all_now(counters)
        assert decision.allowed and decision.remaining == limit - n - 1  # one process: exact
    leased = shared(redis_namespace, "t")
    assert 100 < leased <= 100 + MAX_BLOCK  # blocks, far fewer calls than requests
    admitted = 100
    while b.hit_all_now(counters).allowed:
        admitted += 1
        assert shared(redis_namespace, "t") <= limit
    assert shared(redis_namespace, "t") == limit and admitted < limit  # a still holds quota
    while a.hit_all_now(counters).allowed:
        admitted += 1
    assert admitted == limit
    assert not a.hit_all_now(counters).allowed and not b.hit_all_now(counters).allowed
    clock.now += 60  # the next window: the whole limit again
    assert a.hit_all_now(counters).allowed and b.hit_all_now(counters).remaining == limit - 2


def test_a_refusal_takes_nothing_from_the_other_counter(fleet, redis_namespace):
    _, (a, b) = fleet
    token, app = ("token", Limit(3, 60)), ("app", Limit(1000, 60))
    for _ in range(3):
        assert a.hit_all_now([app, token]).allowed
    before = shared(redis_namespace, "app")
    refused = b.hit_all_now([app, token])
    assert not refused.allowed and refused.key == "token" and refused.remaining == 0
    assert shared(redis_namespace, "app") == before
    assert b.hit_all_now([app]).allowed  # the app's quota is still there for its other tokens


def test_a_lowered_limit_is_obeyed_at_once_though_quota_was_leased(fleet, redis_namespace):
    _, (a, _b) = fleet
    for _ in range(40):  # a holds a block leased under 1000
        assert a.hit_all_now([("t", Limit(1000, 60))]).allowed
    assert shared(redis_namespace, "t") > 40
    refused = a.hit_all_now([("t", Limit(30, 60))])  # `apps update` lowered it below what was counted
    assert not refused.allowed and refused.remaining == 0
