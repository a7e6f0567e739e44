"""SMART App Launch discovery (`{iss}/.well-known/smart-configuration`, SMART App Launch 2.2 §2.1).

One document per clinic FHIR base (`iss`): the same authorization server (the `/v1` endpoints) as
the OpenID configuration, and the capabilities this server really has. Served to any origin.
"""
from __future__ import annotations

from oauth.discovery import TOKEN_ENDPOINT_AUTH_METHODS, endpoints
from oauth.pkce import SUPPORTED_METHODS
from oauth.scopes import advertised_scopes
from oauth.variants import V1

CAPABILITIES = ("launch-ehr", "client-public", "client-confidential-symmetric", "sso-openid-connect",
                "context-ehr-patient", "permission-v2", "permission-patient", "permission-user",
                "permission-offline", "permission-online")


def smart_configuration(settings) -> dict:
    """The SMART configuration of a clinic's FHIR base: the same for every clinic (one authorization
    server; the clinic is told by the launch)."""
    return {
        **endpoints(settings, V1),
        "grant_types_supported": list(V1.grant_types),
        "response_types_supported": ["code"],
        "code_challenge_methods_supported": list(SUPPORTED_METHODS),
        "token_endpoint_auth_methods_supported": list(TOKEN_ENDPOINT_AUTH_METHODS),
        "scopes_supported": advertised_scopes(),
        "capabilities": list(CAPABILITIES),
    }
