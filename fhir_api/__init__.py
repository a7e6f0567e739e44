"""The platform's FHIR R4 API for apps (SMART App Launch): one FHIR base per clinic.

`fhir_base_url` is the clinic's FHIR base, the `iss` of a SMART launch and the `aud` an app must
name at authorize (CONTRACTS: `{SVC_PUBLIC_URL}/fhir/r4/{svcOrganizationId}`).
"""
from __future__ import annotations

FHIR_PATH_PREFIX = "/fhir/r4"


def fhir_base_url(settings, organization_id: str) -> str:
    """The FHIR base URL (`iss`) of one clinic."""
    return f"{settings.public_url.rstrip('/')}{FHIR_PATH_PREFIX}/{organization_id}"
