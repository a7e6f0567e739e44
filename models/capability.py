"""What a FHIR clinic's EHR offers svc-auth, kept per clinic: the source of the clinic's
CapabilityStatement (`fhir_api.clinic_capability`)."""
from __future__ import annotations

import peewee

from models.db import BaseModel


class ClinicCapability(BaseModel):
    """The types the clinic's EHR granted svc-auth (its token's scopes) and the types and search
    parameters its own CapabilityStatement lists, as JSON (`connectors.fhir.capability.clinic_view`),
    learnt from `base_url` at `refreshed_at` and trusted until `expires_at` (epoch seconds).
    Refreshed by `svc-auth ehr check` and when it expires. No foreign key: it is a cache."""

    organization_id = peewee.CharField(primary_key=True, max_length=64)
    base_url = peewee.TextField()
    view = peewee.TextField()
    refreshed_at = peewee.BigIntegerField()
    expires_at = peewee.BigIntegerField()

    class Meta:
        table_name = "clinic_capability"
