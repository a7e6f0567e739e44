"""What a bearer of a user access token may read: userinfo; and the live-token checks introspection
(RFC 7662) and the platform verification use (a token in a parameter, not a bearer)."""
from __future__ import annotations

from errors import ApiError
from oauth.bearer import BearerGate, Caller, known_user, live_claims, usable_installation
from oauth.claims import userinfo_claims
from oauth.tokens import PARTNER_API_AUDIENCE, PLATFORM_AUDIENCE

USERINFO = BearerGate(PLATFORM_AUDIENCE, requirements=(known_user, usable_installation))
"""userinfo's gate: a live user access token, its user still in its clinic, the app usable there."""


def active_user_token(runtime, token: str | None) -> dict | None:
    """Claims of a live user access token, else None (the platform verification: `hub.introspection`)."""
    return live_claims(runtime, token, PLATFORM_AUDIENCE)


def usable_user_token(runtime, token: str | None) -> dict | None:
    """Claims of a user access token the service still honours, else None: `USERINFO`'s gate, so a
    token every resource refuses (its user removed from its clinic, its app removed, or the app's
    installation there removed or `Disabled`) is never introspected active by a client (RFC 7662 2.2)."""
    try:
        return USERINFO.token_caller(runtime, token).claims
    except ApiError as refused:
        if refused.status >= 500:
            raise
        return None


def active_client_token(runtime, token: str | None, app) -> dict | None:
    """Claims of a live client-credentials token issued to `app`, else None."""
    claims = live_claims(runtime, token, PARTNER_API_AUDIENCE)
    return claims if claims is not None and claims.get("sub") == app.id else None


def userinfo(runtime, caller: Caller) -> dict:
    """The userinfo answer for the caller `USERINFO` let in."""
    return userinfo_claims(caller.app, caller.user, caller.user.organization, runtime.settings.claims_namespace)
