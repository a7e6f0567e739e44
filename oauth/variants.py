"""The two address variants of the authorization server (spec: Versioning)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Variant:
    prefix: str
    billing_claims: bool       # ID tokens carry the three billing/trial claims
    grant_types: tuple         # grants the token endpoint accepts


V1 = Variant("/v1", billing_claims=True, grant_types=("authorization_code", "client_credentials", "refresh_token"))
V2 = Variant("/os-api/v2", billing_claims=False, grant_types=("authorization_code", "refresh_token"))
VARIANTS = (V1, V2)
