"""What a bearer of a user access token may read: userinfo, and introspection (RFC 7662)."""
from __future__ import annotations

from models.directory import User
from oauth.claims import userinfo_claims
from oauth.errors import invalid_token, missing_token
from oauth.tokens import PARTNER_API_AUDIENCE, PLATFORM_AUDIENCE, InvalidToken


def bearer_value(authorization: str | None) -> str | None:
    """The token in `Authorization: Bearer <t>` or, as the spec's sample does, `Authorization: <t>`."""
    if not authorization:
        return None
    scheme, _, rest = authorization.strip().partition(" ")
    if rest and scheme.lower() == "bearer":
        return rest.strip() or None
    if not rest:
        return scheme
    return None


def live_claims(runtime, token: str | None, audience: str) -> dict | None:
    """Claims of a live (signed, unexpired, unrevoked) token for `audience`, else None."""
    if not token:
        return None
    try:
        claims = runtime.tokens.verify(token, audience)
    except InvalidToken:
        return None
    if not isinstance(claims.get("jti"), str) or runtime.denylist.is_denied(claims["jti"]):
        return None
    return claims


def active_user_token(runtime, token: str | None) -> dict | None:
    """Claims of a live user access token, else None."""
    return live_claims(runtime, token, PLATFORM_AUDIENCE)


def active_client_token(runtime, token: str | None, app) -> dict | None:
    """Claims of a live client-credentials token issued to `app`, else None."""
    claims = live_claims(runtime, token, PARTNER_API_AUDIENCE)
    return claims if claims is not None and claims.get("sub") == app.id else None


def userinfo(runtime, token: str | None, claims: dict | None = None) -> dict:
    """The userinfo answer for `token`; `claims`: what `active_user_token` already returned for it."""
    if not token:
        raise missing_token("A Bearer access token is required: Authorization: Bearer <access_token>.")
    if claims is None:
        claims = active_user_token(runtime, token)
    if claims is None:
        raise invalid_token()
    user = User.with_organization(claims["sub"])
    app = runtime.applications.by_client_id(claims.get("client_id"))
    if user is None or app is None:
        raise invalid_token()
    return userinfo_claims(app, user, user.organization, runtime.settings.claims_namespace)
