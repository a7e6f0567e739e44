"""The failure throttle's one wiring: check before a secret is tried, count after it failed.

Every guessable secret goes through these two calls with its runtime-owned throttle
(`runtime.client_auth_throttle`, `runtime.sandbox_signin_throttle`,
`runtime.console_signin_throttle`; `ratelimit.failures` counts, in Redis when configured): a
locked subject or address gets 429 with Retry-After, and each lock is audited as `auth.lockout`
with the throttle's name. A console sign-in from a trusted device passes only its device cookie's
subject, without the address (`console.devices`).
"""
from __future__ import annotations

from errors import OAuthError
from models.audit import AuditEvent
from ratelimit.failures import FailureThrottle, Throttled


def throttle_check(throttle: FailureThrottle | None, subject, address: str | None,
                   too_many: str = "Too many failed authentication attempts") -> None:
    """429 + Retry-After while `subject`/`address` is locked. The store (Redis) unreachable raises
    `RateLimiterUnavailable`, which `Runtime.unit_of_work` (every caller's pool) answers with 503."""
    if throttle is None:
        return
    try:
        throttle.check(subject, address)
    except Throttled as exc:
        raise OAuthError("too_many_attempts",
                         f"{too_many}; retry after {exc.retry_after} seconds.",
                         status=429, headers={"Retry-After": str(exc.retry_after)}) from None


def throttle_failure(throttle: FailureThrottle | None, subject, address: str | None,
                     count_address: bool = True) -> None:
    """Count a failed attempt; audit each counter this failure locked. `count_address=False`:
    the subject's own counter only (a console device cookie's), the address still audited."""
    if throttle is None:
        return
    for key in throttle.failed(subject, address if count_address else None):
        AuditEvent.record(f"address:{address or 'unknown'}", "auth.lockout", ":".join(map(str, subject or ())),
                          throttle=throttle.name, locked=list(key), address=address,
                          limit=(throttle.policy.address if key[0] == "address" else throttle.policy.subject).count)
