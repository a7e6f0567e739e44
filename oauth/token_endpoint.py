"""`POST /oauth/token`: client authentication, then the grant named by `grant_type`."""
from __future__ import annotations

from types import MappingProxyType

from oauth.authorization_code import AuthorizationCodeGrant
from oauth.client_credentials import ClientCredentialsGrant
from oauth.clients import authenticate_client, presented_credentials
from oauth.errors import OAuthError
from oauth.params import text_param
from oauth.refresh_token import RefreshTokenGrant
from oauth.secret_rotation import hashed_under_current_key, is_current_secret

GRANTS = MappingProxyType({grant.grant_type: grant for grant in (AuthorizationCodeGrant, ClientCredentialsGrant,
                                                                          RefreshTokenGrant)})


def supported_grants(variant) -> list[str]:
    return [name for name in GRANTS if name in variant.grant_types]


def token_response(runtime, variant, params: dict, authorization: str | None, address: str | None = None) -> dict:
    """The token response for this request, or an `OAuthError` (RFC 6749 5.2)."""
    grant_type = text_param(params, "grant_type")
    if grant_type not in GRANTS or grant_type not in variant.grant_types:
        raise OAuthError("unsupported_grant_type",
                         f"grant_type must be one of: {', '.join(supported_grants(variant))}.")
    app = authenticate_client(runtime, params, authorization, address, allow_public=True)
    response = GRANTS[grant_type](runtime).exchange(app, params, with_billing=variant.billing_claims)
    runtime.metrics.count_token_issued(grant_type)
    return response


def answers_in_memory(runtime, variant, params: dict, authorization: str | None) -> bool:
    """True when `token_response` needs no I/O for this request: a `client_credentials` grant by
    an application this process has cached, with its right secret (checked before any throttle,
    so not even Redis is asked, whatever the configuration). The handler then answers on the
    IOLoop: the work is one HMAC compare and one RS256 signature, and handing it to the pool costs
    more CPU than it saves (BENCHMARKS.md). Anything else goes to the pool."""
    if params.get("grant_type") != "client_credentials" \
            or "client_credentials" not in variant.grant_types or "client_secret" in params and authorization:
        return False
    credentials = presented_credentials(params, authorization)
    if credentials is None:
        return False
    app = runtime.applications.cached(credentials[0])
    return (app is not None and is_current_secret(app, credentials[1], runtime.hasher)
            and hashed_under_current_key(app, runtime.hasher))  # else the pool re-hashes it (authenticate_client)
