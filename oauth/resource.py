"""What a bearer of a user access token may read: userinfo, and introspection (RFC 7662)."""
from __future__ import annotations

from models.application import Application
from models.directory import User
from models.grants import IssuedToken
from oauth.claims import userinfo_claims
from oauth.errors import invalid_token
from oauth.tokens import PLATFORM_AUDIENCE, InvalidToken


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


def active_user_token(runtime, token: str | None) -> dict | None:
    """Claims of a live (signed, unexpired, unrevoked) user access token, else None."""
    if not token:
        return None
    try:
        claims = runtime.tokens.verify(token, PLATFORM_AUDIENCE)
    except InvalidToken:
        return None
    if not IssuedToken.is_active(claims.get("jti", ""), runtime.clock.now()):
        return None
    return claims


def userinfo(runtime, token: str | None) -> dict:
    claims = active_user_token(runtime, token)
    if claims is None:
        raise invalid_token()
    user = User.with_organization(claims["sub"])
    app = Application.by_client_id(claims.get("client_id"))
    if user is None or app is None:
        raise invalid_token()
    return userinfo_claims(app, user, user.organization, runtime.settings.claims_namespace)


def introspection_response(claims: dict | None) -> dict:
    if claims is None:
        return {"active": False}
    return {"active": True, "scope": claims.get("scope", ""), "client_id": claims["client_id"],
            "sub": claims["sub"], "aud": claims["aud"], "iss": claims["iss"], "exp": claims["exp"],
            "iat": claims["iat"], "jti": claims["jti"], "token_type": "Bearer",
            "svc_organization_id": claims.get("org")}
