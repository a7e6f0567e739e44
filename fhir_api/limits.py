"""The FHIR API's request limits: which counters one request counts in, and their limits.

Every authenticated read or search counts once in two fixed-window counters, decided together
(`RateLimiter.hit_all_now`: shared by every serve process through Redis, each process spending
blocks of quota it leased there, `ratelimit.leases`):
- the application in the clinic (`fhir_app:{application id}:{clinic}`): the app's own
  `fhir_rate_limit` (`apps update --fhir-rate-limit`), else SVC_FHIR_RATE_LIMIT (600/60);
- the access token (`fhir_token:{jti}`): the app's `fhir_token_rate_limit`, else
  SVC_FHIR_TOKEN_RATE_LIMIT (200/60).
A request over either is refused (429) and counted in neither. `/metadata` is not limited.
"""
from __future__ import annotations

import re
from types import MappingProxyType

from ratelimit.policy import Limit

UNITS = MappingProxyType({"second": 1, "minute": 60, "hour": 3600, "day": 86400})
MAX_COUNT = 1_000_000
_RATE = re.compile(r"^\s*(\d{1,7})\s*/\s*(\d{1,5}|second|minute|hour|day)\s*$")


def parse_rate(text: str) -> Limit:
    """`600/minute`, `50/second`, `600/60` (seconds) -> Limit; ValueError says what is wrong."""
    m = _RATE.fullmatch(text or "")
    if not m:
        raise ValueError(f"expected COUNT/UNIT (UNIT: second, minute, hour, day) or COUNT/SECONDS, "
                         f"e.g. 600/minute; got {text!r}")
    count = int(m[1])
    seconds = UNITS.get(m[2]) or int(m[2])
    if not 1 <= count <= MAX_COUNT:
        raise ValueError(f"the count must be 1 to {MAX_COUNT}, got {count}")
    if not 1 <= seconds <= 86400:
        raise ValueError(f"the window must be 1 to 86400 seconds (a day), got {seconds}")
    return Limit(count, seconds)


def rate_text(limit: Limit) -> str:
    """How a limit is stored on an application: `COUNT/SECONDS`."""
    return f"{limit.count}/{limit.seconds}"


def _limit(stored: str | None, default: tuple) -> Limit:
    if stored:
        try:
            return parse_rate(stored)
        except ValueError:
            pass  # only `apps update` writes it, validated; a hand-edited bad value falls back
    return Limit(*default)


def app_limits(settings, app) -> tuple[Limit, Limit]:
    """(per application and clinic, per token) limits of `app`."""
    return (_limit(getattr(app, "fhir_rate_limit", None), settings.fhir_rate_limit),
            _limit(getattr(app, "fhir_token_rate_limit", None), settings.fhir_token_rate_limit))


def counters(settings, caller) -> list[tuple[str, Limit]]:
    """The counters (key, limit) one request of `caller` (`fhir_api.access.Caller`) counts in."""
    per_app, per_token = app_limits(settings, caller.app)
    out = [(f"fhir_app:{caller.app.id}:{caller.organization_id}", per_app)]
    jti = caller.claims.get("jti")
    if isinstance(jti, str) and jti:  # every platform token has one (oauth.tokens)
        out.append((f"fhir_token:{jti}", per_token))
    return out


def refusal_message(decision, seconds: int) -> str:
    """Why a request was refused, naming the counter: the app in this clinic, or this token."""
    whose = "this access token" if decision.key.startswith("fhir_token:") else "this application in this clinic"
    return (f"Too many requests for {whose}: the limit is {decision.limit} per {seconds} seconds. "
            f"Retry after {decision.reset} seconds.")
