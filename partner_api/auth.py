"""Who is calling: the application a client-credentials access token was issued to."""
from __future__ import annotations

from models.application import Application
from oauth.errors import invalid_token, missing_token
from oauth.resource import bearer_value, live_claims
from oauth.tokens import PARTNER_API_AUDIENCE


def partner_caller(runtime, authorization: str | None) -> tuple[Application, dict]:
    """(the app, the token's claims) behind `Authorization: Bearer <token>`, or 401 with `WWW-Authenticate`.

    Refused alike: no token, a token that is not ours, expired, revoked, or of another kind
    (a user access token or sandbox token carries another audience)."""
    token = bearer_value(authorization)
    if not token:
        raise missing_token("A Bearer access token from POST /v1/oauth/token is required.")
    claims = live_claims(runtime, token, PARTNER_API_AUDIENCE)
    if claims is None:
        raise invalid_token()
    app = runtime.applications.by_id(claims.get("sub"))
    if app is None or app.public:  # a public client has no secret: the partner API is never its
        raise invalid_token()
    return app, claims
