"""Tokens signed as a service signs them: a `TokenService` on the runtime's keys as any issuer, the
runtime seen as another service, and a platform access token after a launch."""
from __future__ import annotations

from models.application import Application
from models.directory import User


def token_service(runtime, issuer: str | None = None, clock=None):
    """A `TokenService` on the runtime's keys signing as service `issuer` (its address, no trailing
    slash; default the runtime's own), on `clock` (default the runtime's)."""
    from oauth.tokens import TokenService
    iss = runtime.settings.issuer_claim if issuer is None else issuer.rstrip("/") + "/"
    return TokenService(runtime.keyring, iss, clock or runtime.clock)


def as_service(runtime, issuer: str):
    """The runtime seen as the service at `issuer` signs: for `hub.sandbox.issue_sandbox_token`
    and other functions that sign with `runtime.tokens`."""
    return type("AsService", (), {"tokens": token_service(runtime, issuer), "settings": runtime.settings,
                                  "clock": runtime.clock, "keyring": runtime.keyring})()


def mint_platform_token(runtime, issuer: str | None, user: User, app: Application, org, scope: str = "openid user/*.rs",
                        ttl: int = 600, clock_offset: float = 0.0, audience: str | None = None, **extra) -> str:
    """A platform access token as service `issuer` (None: the runtime's own) signs it after a launch
    of `app` by `user` in clinic `org` (an Organization or its id): `sub`, `client_id`, `org`,
    `scope`, and any `extra` claim (`patient`); `audience` defaults to the platform's. Signed at the
    runtime's clock for the runtime itself, at the real time (+ `clock_offset` seconds) for another
    service (a live process does not see the runtime's moved clock)."""
    from models.clock import Clock
    from oauth.tokens import PLATFORM_AUDIENCE
    clock = None if issuer is None and not clock_offset else Clock(clock_offset)
    org_id = org if isinstance(org, str) else org.id
    token, _ = token_service(runtime, issuer, clock).access_token(
        user.id, audience or PLATFORM_AUDIENCE, ttl, client_id=app.client_id, org=org_id, scope=scope, **extra)
    return token
