"""Authorization-server metadata: OpenID Connect Discovery 1.0 and RFC 8414 (one document).

Both well-known paths answer the same JSON, so an OAuth-only client and an OpenID relying party
see the same endpoints and capabilities. Everything advertised here is tested against
openid-client (npm) and Authlib (tests/test_oidc_clients.py).
"""
from __future__ import annotations

from oauth.pkce import SUPPORTED_METHODS
from oauth.scopes import PARTNER_API_SCOPE, advertised_scopes
from oauth.variants import V1

ID_TOKEN_CLAIMS = ("sub", "iss", "aud", "exp", "iat", "auth_time", "nonce", "email", "given_name", "family_name",
                   "application_billing_plan", "is_free_trial", "days_until_end_of_trial", "fhirUser")
# Confidential clients authenticate with their secret; a public client (a browser-only SMART app) with
# none: client_id alone, and PKCE S256 at authorize (oauth/clients.py).
# A backend app (SMART Backend Services) signs a client assertion with its key pair: private_key_jwt
# (RFC 7523; oauth/client_assertion.py), RS384 or ES384.
TOKEN_ENDPOINT_AUTH_METHODS = ("client_secret_basic", "client_secret_post", "none", "private_key_jwt")
TOKEN_ENDPOINT_AUTH_SIGNING_ALGS = ("RS384", "ES384")
# Introspection takes a confidential client's secret or a backend app's assertion, never a public
# client's client_id alone (oauth/introspection.py); revocation takes all four (oauth/revocation.py).
INTROSPECTION_ENDPOINT_AUTH_METHODS = ("client_secret_basic", "client_secret_post", "private_key_jwt")


def claims_supported(settings) -> list[str]:
    """Every claim an ID token or userinfo may carry (userinfo's custom claims are namespaced)."""
    namespace = settings.claims_namespace
    return [*ID_TOKEN_CLAIMS, f"https://{namespace}/ehrUsername", f"https://{namespace}/organization"]


def endpoints(settings, variant=V1) -> dict:
    """The issuer, the JWKS and the endpoints of one prefix: what every discovery document names
    (this one, and SMART's `oauth.smart_configuration`)."""
    base = settings.public_url + variant.prefix
    return {
        "issuer": settings.issuer_claim,
        "authorization_endpoint": f"{base}/oauth/authorize",
        "token_endpoint": f"{base}/oauth/token",
        "userinfo_endpoint": f"{base}/oauth/userinfo",
        "introspection_endpoint": f"{base}/oauth/introspect",
        "revocation_endpoint": f"{base}/oauth/revoke",
        "jwks_uri": f"{settings.issuer}/.well-known/jwks.json",
    }


def openid_configuration(settings, variant=V1) -> dict:
    return {
        **endpoints(settings, variant),
        # A public client revokes its own tokens with client_id alone (oauth/revocation.py).
        "revocation_endpoint_auth_methods_supported": list(TOKEN_ENDPOINT_AUTH_METHODS),
        "response_types_supported": ["code"],
        "response_modes_supported": ["query"],
        "grant_types_supported": list(variant.grant_types),
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": ["RS256"],
        "token_endpoint_auth_methods_supported": list(TOKEN_ENDPOINT_AUTH_METHODS),
        "token_endpoint_auth_signing_alg_values_supported": list(TOKEN_ENDPOINT_AUTH_SIGNING_ALGS),
        "revocation_endpoint_auth_signing_alg_values_supported": list(TOKEN_ENDPOINT_AUTH_SIGNING_ALGS),
        "introspection_endpoint_auth_methods_supported": list(INTROSPECTION_ENDPOINT_AUTH_METHODS),
        "introspection_endpoint_auth_signing_alg_values_supported": list(TOKEN_ENDPOINT_AUTH_SIGNING_ALGS),
        "scopes_supported": advertised_scopes() + ([PARTNER_API_SCOPE] if "client_credentials" in variant.grant_types
                                                     else []),
        "claims_supported": claims_supported(settings),
        "code_challenge_methods_supported": list(SUPPORTED_METHODS),
        "claims_parameter_supported": False,
        # No request objects (OIDC Core 6): `request` and `request_uri` are refused with
        # request_not_supported / request_uri_not_supported. request_uri's default is true, so say so.
        "request_parameter_supported": False,
        "request_uri_parameter_supported": False,
        # RFC 9207: every authorization response, success or error, carries `iss`.
        "authorization_response_iss_parameter_supported": True,
    }
