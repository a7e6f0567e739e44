"""A clinic's CapabilityStatement, true for that clinic (`GET {iss}/metadata`).

A sandbox clinic serves every type and parameter of `fhir_api.capability`. A FHIR clinic claims a
type only when svc-auth serves it, the clinic's EHR granted svc-auth its scope, and the EHR's own
CapabilityStatement lists it; a search parameter only when the EHR lists it for the type too (`_id`
always: every FHIR server takes it; a type the EHR lists without any parameter keeps svc-auth's);
an `_include`/`_revinclude` only when the type it brings is claimed. What the EHR offers is kept per
clinic (`models.capability.ClinicCapability`) for `CAPABILITY_SECONDS`, refreshed by `svc-auth ehr
check` and when it expires; an EHR that cannot be asked then leaves the last one in use (logged),
and with none yet the answer is 503 with Retry-After (the EHR not asked again by this process for
`RETRY_AFTER_SECONDS`: `metadata` needs no token, and must not let anyone hammer a failing EHR).
"""
from __future__ import annotations

import json
import logging

from connectors import Bounds, ConnectorError, connector_for
from connectors.fhir.connector import fhir_state
from connectors.us_core import INCLUDES
from fhir_api.capability import capability_statement
from fhir_api.outcome import FhirError
from models.capability import ClinicCapability
from models.directory import Organization

CAPABILITY_SECONDS = 3600
RETRY_AFTER_SECONDS = 5

log = logging.getLogger("svc_auth.fhir_api")


def refresh(runtime, organization, bounds: Bounds | None = None) -> dict:
    """Ask the clinic's EHR what it offers svc-auth now, and keep it; raises `ConnectorError`."""
    connector = connector_for(runtime, organization, bounds or Bounds.interactive(runtime.settings))
    view = connector.capability_view()
    now = int(runtime.clock.time())
    row = {"base_url": organization.ehr_url or "", "view": json.dumps(view), "refreshed_at": now,
           "expires_at": now + CAPABILITY_SECONDS}
    (ClinicCapability.insert(organization_id=organization.id, **row)
     .on_conflict(conflict_target=[ClinicCapability.organization_id], update=row).execute())
    return view


def clinic_view(runtime, organization) -> dict:
    """What the clinic's EHR offers svc-auth: the kept view while fresh, else asked anew."""
    row = ClinicCapability.get_or_none(ClinicCapability.organization_id == organization.id)
    fresh = row is not None and row.base_url == (organization.ehr_url or "") and row.expires_at > runtime.clock.time()
    if fresh:
        return json.loads(row.view)
    failures = fhir_state(runtime).capability_failures
    try:
        if failures.get(organization.id):
            raise ConnectorError("its EHR failed to answer a moment ago")
        return refresh(runtime, organization)
    except ConnectorError as exc:
        failures.put(organization.id, True, RETRY_AFTER_SECONDS)
        if row is not None and row.base_url == (organization.ehr_url or ""):
            log.warning("metadata of %s: its EHR could not be asked (%s); the last CapabilityStatement stays",
                        organization.id, exc)
            return json.loads(row.view)
        log.warning("metadata of %s: its EHR could not be asked: %s", organization.id, exc)
        raise FhirError(503, "transient", "The clinic's EHR could not be asked what it offers; try again later.",
                        {"Retry-After": str(RETRY_AFTER_SECONDS)}) from None


def narrowed(statement: dict, view: dict) -> dict:
    """`statement` (every type svc-auth serves) with only what the EHR's grant and CapabilityStatement allow."""
    granted = set(view["granted"]) if view.get("granted") is not None else None
    listed = view.get("types")
    claimed = {r["type"] for r in statement["rest"][0]["resource"]
               if (granted is None or r["type"] in granted) and (listed is None or r["type"] in listed)}
    resources = []
    for resource in statement["rest"][0]["resource"]:
        kind = resource["type"]
        if kind not in claimed:
            continue
        resource = dict(resource)
        names = (listed or {}).get(kind)
        if names is not None:
            resource["searchParam"] = [p for p in resource["searchParam"] if p["name"] == "_id" or p["name"] in names]
        if "searchInclude" in resource:
            resource["searchInclude"] = [v for v in resource["searchInclude"] if _brought(v) in claimed]
            if not resource["searchInclude"]:
                del resource["searchInclude"]
        resource["searchRevInclude"] = [v for v in resource["searchRevInclude"] if v.split(":")[0] in claimed]
        if not resource["searchRevInclude"]:
            del resource["searchRevInclude"]
        resources.append(resource)
    rest = {**statement["rest"][0], "resource": resources}
    return {**statement, "rest": [rest]}


def _brought(include: str) -> str:
    """The type an `_include` value brings (`MedicationRequest:medication` -> Medication)."""
    return next((kind for rows in INCLUDES.values() for value, kind, _ in rows if value == include), "")


def clinic_capability_statement(runtime, organization_id: str, published: str) -> dict:
    """The CapabilityStatement of clinic `organization_id` (blocking: the database, maybe its EHR)."""
    statement = capability_statement(runtime.settings, organization_id, published)
    organization = Organization.get_or_none(Organization.id == organization_id)
    if organization is None or organization.ehr != "fhir":
        return statement
    return narrowed(statement, clinic_view(runtime, organization))
