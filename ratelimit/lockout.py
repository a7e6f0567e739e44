"""The failure throttle's one wiring: check before a secret is tried, count after it failed.

Every guessable secret goes through these calls with its runtime-owned throttle
(`runtime.client_auth_throttle`, `runtime.sandbox_signin_throttle`,
`runtime.console_signin_throttle`; `ratelimit.failures` counts, in Redis when configured): a
locked subject or address gets 429 with Retry-After, and each lock is audited as `auth.lockout`
with the throttle's name. A console sign-in counts its attempt as it checks the throttle
(`throttle_attempt`), taken back when the password is right; from a trusted device it passes only
its device cookie's subject, without the address (`console.devices`).
"""
from __future__ import annotations

from errors import OAuthError
from models.audit import AuditEvent
from ratelimit.failures import Attempt, FailureThrottle, Throttled


def _refused(exc: Throttled, too_many: str) -> OAuthError:
    return OAuthError("too_many_attempts", f"{too_many}; retry after {exc.retry_after} seconds.",
                      status=429, headers={"Retry-After": str(exc.retry_after)})


def throttle_check(throttle: FailureThrottle | None, subject, address: str | None,
                   too_many: str = "Too many failed authentication attempts") -> None:
    """429 + Retry-After while `subject`/`address` is locked. The store (Redis) unreachable raises
    `RateLimiterUnavailable`, which `Runtime.unit_of_work` (every caller's pool) answers with 503."""
    if throttle is None:
        return
    try:
        throttle.check(subject, address)
    except Throttled as exc:
        raise _refused(exc, too_many) from None


def throttle_attempt(throttle: FailureThrottle | None, subject, address: str | None,
                     too_many: str = "Too many failed authentication attempts") -> Attempt | None:
    """`throttle_check`, and the attempt counted as a failure at once (`FailureThrottle.attempt`),
    for a secret whose check takes long (a console password's hash): then `throttle_failed` if it
    failed, `throttle_withdraw` if it succeeded."""
    if throttle is None:
        return None
    try:
        return throttle.attempt(subject, address)
    except Throttled as exc:
        raise _refused(exc, too_many) from None


def throttle_failed(throttle: FailureThrottle | None, attempt: Attempt | None, subject, address: str | None) -> None:
    """The `attempt` failed: it is counted already; audit each counter it locked."""
    if throttle is not None and attempt is not None:
        _audit(throttle, attempt.locked, subject, address)


def throttle_withdraw(throttle: FailureThrottle | None, attempt: Attempt | None) -> None:
    """The `attempt` succeeded: no failure."""
    if throttle is not None and attempt is not None:
        throttle.withdraw(attempt)


def throttle_failure(throttle: FailureThrottle | None, subject, address: str | None) -> None:
    """Count a failed attempt; audit each counter this failure locked."""
    if throttle is None:
        return
    _audit(throttle, throttle.failed(subject, address), subject, address)


def _audit(throttle: FailureThrottle, locked: list, subject, address: str | None) -> None:
    for key in locked:
        AuditEvent.record(f"address:{address or 'unknown'}", "auth.lockout", ":".join(map(str, subject or ())),
                          throttle=throttle.name, locked=list(key), address=address,
                          limit=(throttle.policy.address if key[0] == "address" else throttle.policy.subject).count)
