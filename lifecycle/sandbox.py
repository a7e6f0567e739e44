"""The sandbox EHR's settings-page token: who the platform user is, for 30 minutes."""
from __future__ import annotations

from models.directory import User
from oauth.errors import invalid_token
from oauth.tokens import SANDBOX_AUDIENCE, InvalidToken


def issue_sandbox_token(runtime, user: User) -> str:
    token, _ = runtime.tokens.access_token(user.id, SANDBOX_AUDIENCE, runtime.settings.sandbox_token_ttl,
                                           org=user.organization_id)
    return token


def sandbox_user(runtime, token: str | None) -> User:
    """The user a sandbox token names, or 401 "Authentication failed" (spec: expired token)."""
    try:
        claims = runtime.tokens.verify(token or "", SANDBOX_AUDIENCE)
    except InvalidToken:
        raise invalid_token(message="Authentication failed") from None
    user = User.get_or_none(User.id == claims["sub"])
    if user is None:
        raise invalid_token(message="Authentication failed")
    return user
