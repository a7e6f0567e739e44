"""OpenID Provider metadata (OpenID Connect Discovery 1.0)."""
from __future__ import annotations

from oauth.pkce import SUPPORTED_METHODS
from oauth.variants import V1


def openid_configuration(settings, variant=V1) -> dict:
    base = settings.public_url + variant.prefix
    return {
        "issuer": settings.issuer_claim,
        "authorization_endpoint": f"{base}/oauth/authorize",
        "token_endpoint": f"{base}/oauth/token",
        "userinfo_endpoint": f"{base}/oauth/userinfo",
        "introspection_endpoint": f"{base}/oauth/introspect",
        "revocation_endpoint": f"{base}/oauth/revoke",
        "revocation_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
        "jwks_uri": f"{settings.issuer}/.well-known/jwks.json",
        "response_types_supported": ["code"],
        "response_modes_supported": ["query"],
        "grant_types_supported": list(variant.grant_types),
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": ["RS256"],
        "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
        "introspection_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
        "scopes_supported": ["openid", "email", "profile"],
        "claims_supported": ["sub", "iss", "aud", "exp", "iat", "auth_time", "nonce", "email", "given_name",
                             "family_name", "application_billing_plan", "is_free_trial",
                             "days_until_end_of_trial"],
        "code_challenge_methods_supported": list(SUPPORTED_METHODS),
        "claims_parameter_supported": False,
        "request_parameter_supported": False,
    }
