"""`POST /oauth/token`: client authentication, then the grant named by `grant_type`.

Client authentication is a secret (`oauth.clients`: HTTP Basic or the body), a public client's
client_id alone, or a client assertion (`oauth.client_assertion`, RFC 7523 `private_key_jwt`); the
client credentials grant with an assertion is a backend app's system token
(`oauth.system_credentials`), with a secret the partner API token (`oauth.client_credentials`)."""
from __future__ import annotations

from types import MappingProxyType

from models.application import Application
from oauth.authorization_code import AuthorizationCodeGrant
from oauth.client_assertion import authenticate_assertion, presents_assertion, spend
from oauth.client_credentials import ClientCredentialsGrant
from oauth.clients import authenticate_client, presented_credentials
from oauth.errors import OAuthError
from oauth.params import text_param
from oauth.refresh_token import RefreshTokenGrant
from oauth.secret_rotation import hashed_under_current_key, is_current_secret
from oauth.system_credentials import SystemCredentialsGrant

GRANTS = MappingProxyType({grant.grant_type: grant for grant in (AuthorizationCodeGrant, ClientCredentialsGrant,
                                                                          RefreshTokenGrant)})


def supported_grants(variant) -> list[str]:
    return [name for name in GRANTS if name in variant.grant_types]


def token_response(runtime, variant, params: dict, authorization: str | None, address: str | None = None,
                   client: Application | None = None) -> dict:
    """The token response for this request, or an `OAuthError` (RFC 6749 5.2). `client`: the
    application `in_memory_client` has already authenticated (its checks are not made twice)."""
    grant_type = text_param(params, "grant_type")
    if grant_type not in GRANTS or grant_type not in variant.grant_types:
        raise OAuthError("unsupported_grant_type",
                         f"grant_type must be one of: {', '.join(supported_grants(variant))}.")
    if client is None and presents_assertion(params):  # private_key_jwt (RFC 7523): a backend app's key pair
        assertion_client = authenticate_assertion(runtime, params, authorization, address)
        if grant_type == SystemCredentialsGrant.grant_type:
            response = SystemCredentialsGrant(runtime).exchange(assertion_client, params)  # spends the jti itself
        else:
            spend(runtime, assertion_client)
            response = GRANTS[grant_type](runtime).exchange(assertion_client.app, params,
                                                            with_billing=variant.billing_claims)
        runtime.metrics.count_token_issued(grant_type)
        return response
    app = client or authenticate_client(runtime, params, authorization, address, allow_public=True)
    response = GRANTS[grant_type](runtime).exchange(app, params, with_billing=variant.billing_claims)
    runtime.metrics.count_token_issued(grant_type)
    return response


def in_memory_client(runtime, variant, params: dict, authorization: str | None) -> Application | None:
    """The application of a request `token_response` can answer with no I/O, else None: a
    `client_credentials` grant by an application this process has cached, with its right secret
    (checked before any throttle, so not even Redis is asked, whatever the configuration), one
    authentication method, and no other client_id in the body. The handler then answers on the
    IOLoop, passing this application to `token_response` (authenticated once): the work is one
    HMAC compare and one RS256 signature, and handing it to the pool costs more CPU than it saves
    (BENCHMARKS.md). Anything else goes to the pool, whose `authenticate_client` answers it."""
    if params.get("grant_type") != "client_credentials" or "client_credentials" not in variant.grant_types \
            or "client_secret" in params and authorization or presents_assertion(params):
        return None
    credentials = presented_credentials(params, authorization)
    if credentials is None:
        return None
    client_id, secret = credentials
    if params.get("client_id", client_id) != client_id:  # Basic and another body client_id: invalid_request
        return None
    app = runtime.applications.cached(client_id)
    if app is None or not is_current_secret(app, secret, runtime.hasher) or not hashed_under_current_key(app, runtime.hasher):
        return None  # else the pool answers (a wrong secret is counted; an old key's hash is re-hashed)
    return app
