"""SMART App Launch discovery (`{iss}/.well-known/smart-configuration`, SMART App Launch 2.2 §2.1).

One document per clinic FHIR base (`iss`): the same authorization server (the `/v1` endpoints) as
the OpenID configuration, and the capabilities this server really has. Served to any origin.
"""
from __future__ import annotations

from oauth.discovery import TOKEN_ENDPOINT_AUTH_METHODS, TOKEN_ENDPOINT_AUTH_SIGNING_ALGS, endpoints
from oauth.pkce import SUPPORTED_METHODS
from oauth.scopes import advertised_scopes
from oauth.variants import V1

CAPABILITIES = ("launch-ehr", "authorize-post", "client-public", "client-confidential-symmetric", "client-confidential-asymmetric",
                "sso-openid-connect", "context-ehr-patient", "permission-v1", "permission-v2", "permission-patient",
                "permission-user", "permission-offline", "permission-online")
"""`authorize-post`: the authorize endpoint takes a form POST as it takes a GET (handlers/oauth.py);
`client-confidential-asymmetric`: private_key_jwt (RS384, ES384; oauth/client_assertion.py), the
backend apps' authentication; `permission-v1`: v1 scopes (`.read`) are understood beside v2's."""
SYSTEM_SCOPES_ADVERTISED = ("system/*.rs", "system/*.read")
"""SMART Backend Services: a backend app asks read-only system scopes it registered."""


def smart_configuration(settings) -> dict:
    """The SMART configuration of a clinic's FHIR base: the same for every clinic (one authorization
    server; the clinic is told by the launch)."""
    return {
        **endpoints(settings, V1),
        "grant_types_supported": list(V1.grant_types),
        "response_types_supported": ["code"],
        "code_challenge_methods_supported": list(SUPPORTED_METHODS),
        "token_endpoint_auth_methods_supported": list(TOKEN_ENDPOINT_AUTH_METHODS),
        "token_endpoint_auth_signing_alg_values_supported": list(TOKEN_ENDPOINT_AUTH_SIGNING_ALGS),
        "scopes_supported": [*advertised_scopes(), *SYSTEM_SCOPES_ADVERTISED],
        "capabilities": list(CAPABILITIES),
    }
