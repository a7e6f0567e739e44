"""The CapabilityStatement (`GET {iss}/metadata`): what this FHIR API serves and how to get a token."""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from types import MappingProxyType

from fhir_api.bulk_data import with_bulk_data
from fhir_api import fhir_base_url
from connectors.us_core import (INCLUDES, PROFILES, REVINCLUDES, SEARCH_PARAMS, SUPPORTED_TYPES, US_CORE_PROFILE,
                               US_CORE_SERVER)
from oauth.discovery import endpoints
from oauth.variants import V1

SMART_OAUTH_URIS = "http://fhir-registry.smarthealthit.org/StructureDefinition/oauth-uris"
SMART_OAUTH_URI_ENDPOINTS = (("authorize", "authorization_endpoint"), ("token", "token_endpoint"),
                             ("introspect", "introspection_endpoint"), ("revoke", "revocation_endpoint"))
"""The oauth-uris extension's names, each with the discovery document's endpoint it repeats."""
RESOURCES = tuple(MappingProxyType({
    "type": kind,
    **({"supportedProfile": [US_CORE_PROFILE + p for p in PROFILES[kind]]} if kind in PROFILES else {}),
    "interaction": [{"code": "read"}, {"code": "search-type"}],
    **({"searchInclude": [row[0] for row in INCLUDES[kind]]} if kind in INCLUDES else {}),
    "searchRevInclude": [row[0] for row in REVINCLUDES],
    "searchParam": [{"name": "_id", "type": "token"}] + [{"name": name, "type": kind_}
                                                         for name, (kind_, _) in SEARCH_PARAMS[kind].items()],
}) for kind in SUPPORTED_TYPES)
"""Each type served, its US Core profiles, and every search parameter and include actually served:
from the tables the search code uses (`connectors.us_core`)."""


def software_version() -> str:
    try:
        return version("svc-auth")
    except PackageNotFoundError:
        return "unknown"


def capability_statement(settings, organization_id: str, published: str) -> dict:
    """The clinic's CapabilityStatement (`published`: its date, YYYY-MM-DD)."""
    base = fhir_base_url(settings, organization_id)
    urls = endpoints(settings, V1)  # the SMART configuration's own (`oauth.discovery`: the only builder)
    oauth = [(name, urls[key]) for name, key in SMART_OAUTH_URI_ENDPOINTS]
    resources = [dict(resource) for resource in RESOURCES]
    return with_bulk_data({  # issue 48: Bulk Data (fhir_api.bulk_data)
        "resourceType": "CapabilityStatement",
        "status": "active", "kind": "instance", "date": published, "instantiates": [US_CORE_SERVER],
        "software": {"name": "svc-auth", "version": software_version()},
        "implementation": {"description": "svc-auth platform FHIR API", "url": base},
        "fhirVersion": "4.0.1", "format": ["json"],
        "rest": [{
            "mode": "server",
            "security": {
                "extension": [{"url": SMART_OAUTH_URIS,
                               "extension": [{"url": name, "valueUri": uri} for name, uri in oauth]}],
                "service": [{"coding": [{"system": "http://terminology.hl7.org/CodeSystem/restful-security-service",
                                         "code": "SMART-on-FHIR"}], "text": "OAuth2 using SMART-on-FHIR profile"}],
                "description": "Bearer access tokens of a SMART launch (scopes patient/*.rs, user/*.rs)."},
            "resource": resources,
            "searchParam": [{"name": "_count", "type": "number"}, {"name": "_offset", "type": "number"}]}]})
