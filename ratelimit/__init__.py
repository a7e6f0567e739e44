"""Rate limits of the partner REST API: one interface, an in-memory and a Redis implementation.

Both count requests per (client, operation) in fixed windows aligned to the service clock
(the runtime's clock), so a limit of N per minute allows exactly N requests in each clock minute. The
Redis limiter does the whole decision in one Lua script (one atomic round trip), so any number of
`serve` processes sharing a Redis together allow exactly the limit; the FHIR API's `hit_all_now`
leases blocks of quota in such a script and spends them in memory (`ratelimit.leases`), never
past the limit.
"""
from __future__ import annotations

from ratelimit.limiter import Decision, MemoryRateLimiter, RateLimiter, RateLimiterUnavailable  # noqa: F401
from ratelimit.policy import DEFAULT_LIMITS, Limit, limits_from_settings  # noqa: F401


def build_rate_limiter(settings, clock) -> RateLimiter:
    """The limiter the configuration asks for: Redis when SVC_REDIS_URL is set, else in-memory."""
    limits = limits_from_settings(settings)
    if settings.redis_url:
        from ratelimit.redis_limiter import RedisRateLimiter
        return RedisRateLimiter(settings.redis_url, limits, clock, namespace=settings.redis_namespace)
    return MemoryRateLimiter(limits, clock)
