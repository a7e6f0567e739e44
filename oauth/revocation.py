"""Token revocation (RFC 7009) and the one place a token is marked revoked.

`revoke_jti` is the single write path (swap it for a jti deny-list without touching callers);
`IssuedToken.is_active` is what userinfo, introspection and the partner API check."""
from __future__ import annotations

from models.application import Application
from models.grants import IssuedToken
from oauth.tokens import PARTNER_API_AUDIENCE, PLATFORM_AUDIENCE, InvalidToken


def revoke_jti(jti: str, now) -> bool:
    """Mark the token `jti` revoked; True when it was active until now."""
    return (IssuedToken.update(revoked_at=now)
            .where((IssuedToken.jti == jti) & IssuedToken.revoked_at.is_null()).execute()) == 1


def token_owner_claims(runtime, token: str) -> tuple[str, dict] | None:
    """(client_id the token was issued to, its claims) for a signed, unexpired access token of ours."""
    for audience in (PLATFORM_AUDIENCE, PARTNER_API_AUDIENCE):
        try:
            claims = runtime.tokens.verify(token, audience)
        except InvalidToken:
            continue
        if audience == PLATFORM_AUDIENCE:
            return claims.get("client_id"), claims
        app = Application.by_id(claims.get("sub"))  # a client-credentials token names its app
        return (app.client_id if app else None), claims
    return None


def revoke_token(runtime, app: Application, token: str) -> None:
    """RFC 7009 2.1: revoke `token` if `app` owns it. Unknown, invalid, expired or another
    client's tokens change nothing and answer the same (2.2), so nothing leaks about them."""
    found = token_owner_claims(runtime, token)
    if found is None:
        return
    client_id, claims = found
    if client_id != app.client_id or not isinstance(claims.get("jti"), str):
        return
    revoke_jti(claims["jti"], runtime.clock.now())
