"""The platform's own introspection: the hub asks `POST {p}/oauth/introspect` with its user's sandbox
token, and an active token of that same user is the platform verification
(`lifecycle.verification.record_platform_verification`)."""
from __future__ import annotations

from hub.sandbox import sandbox_user
from lifecycle.verification import record_platform_verification
from oauth.introspection import introspection_response
from oauth.resource import active_user_token


def platform_introspection(runtime, authorization: str, token: str) -> dict:
    """`POST {p}/oauth/introspect` by the platform (`authorization`: Bearer, the sandbox token of the hub's user).

    An access token that is active and was issued to that same user is the platform verification
    (`record_platform_verification`). Only then does the answer carry `id_token`: the ID token the
    service issued with that access token, which the hub passes to the app's SDK (`getIdToken()` in
    the identity-provider variant, where the app handed the SDK only its access token)."""
    platform_user = sandbox_user(runtime, authorization)
    claims = active_user_token(runtime, token)
    if claims is None or claims["sub"] != platform_user.id:
        return introspection_response(None)
    app = runtime.applications.by_client_id(claims["client_id"])
    if app is None:
        return introspection_response(None)
    record_platform_verification(runtime, app, platform_user)
    body = introspection_response(claims)
    sealed = claims.get("svc_idt")
    body["id_token"] = runtime.hasher.unseal(sealed, claims["jti"]) if isinstance(sealed, str) else None
    return body
