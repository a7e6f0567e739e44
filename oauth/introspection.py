"""Token introspection (RFC 7662): is this token active, and what does it say?

Two callers: a client authenticated as itself, which learns about its own tokens only (a user's
access token issued to it, or its client-credentials token); or the host platform presenting a
sandbox user's token (`Authorization: Bearer`), whose check is the platform verifying the app's
token for that user. That second answer is the platform's business (`hub.introspection`), so
the caller passes it in as `platform_check`.
"""
from __future__ import annotations

from oauth.bearer import live_claims
from oauth.client_assertion import authenticate_assertion, presents_assertion, spend
from oauth.clients import authenticate_client
from oauth.resource import active_client_token, usable_user_token
from oauth.smart_grants import introspected
from oauth.tokens import PARTNER_API_AUDIENCE, SYSTEM_AUDIENCE


def introspect(runtime, params: dict, token: str, authorization: str, address: str, platform_check) -> dict:
    """The RFC 7662 answer for this caller (blocking: runs on the runtime's pool)."""
    if authorization.lower().startswith("bearer "):
        return platform_check(runtime, authorization, token)
    if presents_assertion(params):  # a backend app's key pair (its jti is spent)
        client = authenticate_assertion(runtime, params, authorization, address)
        spend(runtime, client)
        app = client.app
    else:
        app = authenticate_client(runtime, params, authorization, address)  # first: no token work for strangers
    claims = usable_user_token(runtime, token)  # refused everywhere (user gone, app Disabled): inactive
    if claims is not None and claims["client_id"] != app.client_id:
        claims = None
    if claims is None:
        claims = active_client_token(runtime, token, app)  # the client's own client-credentials token
    if claims is None:
        claims = live_claims(runtime, token, SYSTEM_AUDIENCE)  # a backend app's own system token
        if claims is not None and claims.get("client_id") != app.client_id:
            claims = None
    if claims is None:
        return introspected(runtime, app, token) or {"active": False}  # its SMART refresh token
    return introspection_response(claims)


def introspection_response(claims: dict | None) -> dict:
    if claims is None:
        return {"active": False}
    if claims.get("aud") in (PARTNER_API_AUDIENCE, SYSTEM_AUDIENCE):  # a client-credentials token: no user
        return {"active": True, "scope": claims.get("scope", ""), "client_id": claims.get("client_id"),
                "sub": claims["sub"], "aud": claims["aud"], "iss": claims["iss"], "exp": claims["exp"],
                "iat": claims["iat"], "jti": claims["jti"], "token_type": "Bearer"}
    # A SMART launch token adds its launch context: `patient` and `fhirUser` when it has them.
    context = {name: claims[name] for name in ("patient", "fhirUser") if isinstance(claims.get(name), str)}
    return {"active": True, "scope": claims.get("scope", ""), "client_id": claims["client_id"],
            "sub": claims["sub"], "aud": claims["aud"], "iss": claims["iss"], "exp": claims["exp"],
            "iat": claims["iat"], "jti": claims["jti"], "token_type": "Bearer",
            "svc_organization_id": claims.get("org"), **context}
