"""What a bearer of a user access token may read: userinfo; and the live-token checks introspection
(RFC 7662) and the platform verification use (a token in a parameter, not a bearer)."""
from __future__ import annotations

from errors import ApiError
from oauth.bearer import BearerGate, Caller, insufficient_scope, known_user, live_claims, usable_installation
from oauth.claims import userinfo_claims
from oauth.tokens import PARTNER_API_AUDIENCE, PLATFORM_AUDIENCE

OPENID = "openid"


def openid_scope(gate: BearerGate, runtime, caller: Caller, context: dict) -> Caller:
    """UserInfo is OpenID Connect's (OIDC Core 5.3): the token's scope has `openid`, else 403
    `insufficient_scope` naming it (as node-oidc-provider answers). Authorize always grants it;
    only a refresh narrowed away from it lacks it, and such a token must not say who the user is."""
    scope = caller.claims.get("scope")
    if not isinstance(scope, str) or OPENID not in scope.split():
        raise insufficient_scope("UserInfo needs an access token whose scope includes openid.", scope=OPENID,
                                 realm=gate.realm)
    return caller


USABLE = BearerGate(PLATFORM_AUDIENCE, requirements=(known_user, usable_installation))
"""A live user access token, its user still in its clinic, the app usable there: what every
resource requires of a user token (introspection's answer, `usable_user_token`)."""
USERINFO = BearerGate(PLATFORM_AUDIENCE, requirements=(known_user, usable_installation, openid_scope))
"""userinfo's gate: `USABLE`, and `openid` in the token's scope."""


def active_user_token(runtime, token: str | None) -> dict | None:
    """Claims of a live user access token, else None (the platform verification: `hub.introspection`)."""
    return live_claims(runtime, token, PLATFORM_AUDIENCE)


def usable_user_token(runtime, token: str | None) -> dict | None:
    """Claims of a user access token the service still honours, else None: `USABLE`'s gate, so a
    token every resource refuses (its user removed from its clinic, its app removed, or the app's
    installation there removed or `Disabled`) is never introspected active by a client (RFC 7662 2.2)."""
    try:
        return USABLE.token_caller(runtime, token).claims
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
