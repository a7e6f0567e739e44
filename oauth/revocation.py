"""Token revocation (RFC 7009): a client revokes its own access tokens, and its SMART refresh
tokens: revoking a refresh token ends its whole grant (`oauth.smart_grants`).

A revoked token's jti goes on the deny-list (`oauth.denylist`, `runtime.denylist`) until the token
would have expired anyway; userinfo, introspection and the partner API refuse a denied jti."""
from __future__ import annotations

from models.application import Application
from oauth.client_assertion import authenticate_assertion, presents_assertion, spend
from oauth.clients import authenticate_client
from oauth.params import text_param
from oauth.smart_grants import revoke_by_token
from oauth.tokens import PARTNER_API_AUDIENCE, PLATFORM_AUDIENCE, SYSTEM_AUDIENCE, InvalidToken


def token_owner_claims(runtime, token: str) -> tuple[str | None, dict] | None:
    """(client_id the token was issued to, its claims) for a signed, unexpired access token of ours."""
    for audience in (PLATFORM_AUDIENCE, PARTNER_API_AUDIENCE, SYSTEM_AUDIENCE):
        try:
            claims = runtime.tokens.verify(token, audience)
        except InvalidToken:
            continue
        if audience != PARTNER_API_AUDIENCE:  # user and system tokens name their client
            return claims.get("client_id"), claims
        app = runtime.applications.by_id(claims.get("sub"))  # a client-credentials token names its app
        return (app.client_id if app else None), claims
    return None


def revoke_token(runtime, app: Application, token: str) -> None:
    """RFC 7009 2.1: revoke `token` if `app` owns it. Unknown, invalid, expired or another
    client's tokens change nothing and answer the same (2.2), so nothing leaks about them."""
    found = token_owner_claims(runtime, token)
    if found is None:
        revoke_by_token(runtime, app, token)  # a refresh token of this client's ends its grant
        return
    client_id, claims = found
    if client_id != app.client_id or not isinstance(claims.get("jti"), str):
        return
    runtime.denylist.deny([claims["jti"]], until=float(claims.get("exp") or runtime.clock.time()))


def revoke(runtime, params: dict, authorization: str | None, address: str) -> None:
    """The revocation request: the client authenticates (its secret, or a backend app's client
    assertion, whose jti is then spent), then revokes `token` if it is its own."""
    if presents_assertion(params):
        client = authenticate_assertion(runtime, params, authorization, address)
        spend(runtime, client)
        app = client.app
    else:
        app = authenticate_client(runtime, params, authorization, address, allow_public=True)
    token = text_param(params, "token", max_length=8000)
    revoke_token(runtime, app, token)
