"""The scopes an authorization request may name (anything else: `invalid_scope`).

Authorization requests: `openid` plus one scope per user field an application can declare: `email` (email), `profile`
(name: given_name, family_name), `ehr_username` and `organization` (the namespaced userinfo
claims). The client credentials grant grants `partner_api` only. What userinfo releases is decided by the application's declared user fields (its
manifest); a scope never releases a field the app did not declare.
"""
from __future__ import annotations

from oauth.errors import OAuthError

SUPPORTED_SCOPES = ("openid", "email", "profile", "ehr_username", "organization")
PARTNER_API_SCOPE = "partner_api"  # the client credentials grant's only scope (at /v1)


class InvalidScope(OAuthError):
    def __init__(self, description: str):
        super().__init__("invalid_scope", description)


def granted_scope(requested: str | None) -> str:
    """The scope string granted for `requested` (space-separated); `openid` is always granted.
    Raises InvalidScope naming the first unknown scope."""
    names = (requested or "").split()
    unknown = [n for n in names if n not in SUPPORTED_SCOPES]
    if unknown:
        raise InvalidScope(f"Unknown scope {unknown[0]!r}; supported: {' '.join(SUPPORTED_SCOPES)}.")
    return " ".join(dict.fromkeys(["openid", *names]))
