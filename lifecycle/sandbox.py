"""The sandbox EHR's settings-page token: who the platform user is, for 30 minutes."""
from __future__ import annotations

import datetime as dt

from models.directory import User
from oauth.errors import invalid_token
from oauth.tokens import SANDBOX_AUDIENCE, InvalidToken


def issue_sandbox_token(runtime, user: User, auth_time: int | float | dt.datetime | None = None) -> str:
    """A sandbox token for `user`. `auth_time`: when the user authenticated with the platform
    (epoch seconds, or a naive-UTC/aware datetime; default now). It travels on every launch the
    token creates into the ID token's `auth_time`, so one platform session has one auth_time."""
    if auth_time is None:
        auth_time = runtime.clock.time()
    elif isinstance(auth_time, dt.datetime):
        aware = auth_time if auth_time.tzinfo else auth_time.replace(tzinfo=dt.timezone.utc)
        auth_time = aware.timestamp()
    token, _ = runtime.tokens.access_token(user.id, SANDBOX_AUDIENCE, runtime.settings.sandbox_token_ttl,
                                           org=user.organization_id, auth_time=int(auth_time))
    return token


def sandbox_session(runtime, token: str | None) -> tuple[User, int]:
    """The user a sandbox token names and when they authenticated with the platform (epoch
    seconds; a token from before `auth_time` existed counts from its `iat`), or 401."""
    try:
        claims = runtime.tokens.verify(token or "", SANDBOX_AUDIENCE)
    except InvalidToken:
        raise invalid_token(message="Authentication failed") from None
    user = User.get_or_none(User.id == claims["sub"])
    if user is None:
        raise invalid_token(message="Authentication failed")
    auth_time = claims.get("auth_time")
    return user, auth_time if isinstance(auth_time, int) else claims["iat"]


def sandbox_user(runtime, token: str | None) -> User:
    """The user a sandbox token names, or 401 "Authentication failed" (spec: expired token)."""
    return sandbox_session(runtime, token)[0]
