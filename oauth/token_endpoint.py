"""`POST /oauth/token`: client authentication, then the grant named by `grant_type`."""
from __future__ import annotations

from oauth.authorization_code import AuthorizationCodeGrant
from oauth.client_credentials import ClientCredentialsGrant
from oauth.clients import authenticate_client
from oauth.errors import OAuthError
from oauth.params import text_param
from ops.metrics import count_token_issued

GRANTS = {grant.grant_type: grant for grant in (AuthorizationCodeGrant, ClientCredentialsGrant)}


def supported_grants(variant) -> list[str]:
    return [name for name in GRANTS if name in variant.grant_types]


def token_response(runtime, variant, params: dict, authorization: str | None, address: str | None = None) -> dict:
    """The token response for this request, or an `OAuthError` (RFC 6749 5.2)."""
    grant_type = text_param(params, "grant_type")
    if grant_type not in GRANTS or grant_type not in variant.grant_types:
        raise OAuthError("unsupported_grant_type",
                         f"grant_type must be one of: {', '.join(supported_grants(variant))}.")
    app = authenticate_client(params, authorization, runtime.hasher, runtime.client_auth_throttle, address)
    response = GRANTS[grant_type](runtime).exchange(app, params, with_billing=variant.billing_claims)
    count_token_issued(grant_type)
    return response
