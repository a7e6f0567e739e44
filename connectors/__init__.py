"""EHR connectors: how svc-auth reads a clinic's EHR.

A connector is one module `connectors/<ehr>.py` with a function `connect(runtime, organization)
-> Connector`, listed in `CONNECTORS` under the name an organization's `ehr` field holds
(`sandbox`: our generator; `fhir`: a FHIR R4 EHR over SMART Backend Services). The
interface (`connectors.base`) is re-exported here. A connector does two things:

- `fetch_appointments(provider, start, end)`: the provider's appointments starting in [start, end)
  (naive UTC datetimes), as `Appointment`s, in any order; may be a generator.
- `fetch_chart(patient_id)`: the patient's `Chart`; its `encounters()`, `observations()` and
  `documents()` may stream (from the EHR, or from a spool of what was read from it).

For SMART's `fhirUser`, `user_practitioner(provider)`: the id of the user's Practitioner in the
EHR (found by NPI), or None when the EHR has none (`practitioner_of`).

For the platform FHIR API (`/fhir/r4/{org}`, SMART apps), a connector also answers, as FHIR R4 JSON:
- `read_resource(resource_type, resource_id)`: one resource (a dict), or raise `ResourceNotFound`.
- `search_resources(query)`: the resources matching a `ResourceQuery` (neutral terms: no FHIR
  search syntax outside a connector), an iterator in a stable order.

Errors: raise `ConnectorUnavailable` for anything worth retrying (timeouts, 5xx, maintenance);
`PatientNotFound` / `ConnectorError` for permanent failures, which are not retried;
`BoundExceeded` (`DeadlineExceeded` for time) when the EHR pushed a request past the caller's
`Bounds` (`connectors.bounds`: `connect(runtime, organization, bounds)`); `EhrReportedError` when
the EHR answered an error OperationOutcome.
"""
from __future__ import annotations

import logging
from types import MappingProxyType

from connectors import fhir, sandbox
from connectors.base import (APPOINTMENT_STATUSES, LISTED_STATUSES, Appointment, BoundExceeded, Chart,  # noqa: F401
                             Connector, ConnectorError, Criterion, ConnectorUnavailable, DeadlineExceeded, EhrReportedError,
                             Encounter, NO_VALID_ID, Patient, PatientNotFound, Provider, ResourceNotFound, ResourceQuery,
                             Skipped, TypeNotGranted)
from connectors.bounds import Bounds  # noqa: F401
from models.directory import Organization, User

log = logging.getLogger("svc_auth.connectors")

CONNECTORS = MappingProxyType({"sandbox": sandbox.connect, "fhir": fhir.connect})
"""Each EHR's `connect(runtime, organization) -> Connector`, by the name an organization's `ehr` field holds."""


def connector_for(runtime, organization, bounds: Bounds | None = None, recorder=None) -> Connector:
    """The connector of the organization's EHR, held to the caller's `bounds` (default: the batch
    bounds of the night and chart builds). `recorder`: the disclosure audit's callback
    (`audit.disclosures.ehr_recorder`), which the connector calls once per request to its EHR
    (once per call on the sandbox): `recorder(outcome, resource_type, resource_ids, patients, query)`."""
    connect = CONNECTORS.get(organization.ehr or "")
    if connect is None:
        raise ConnectorError(f"No connector for EHR {organization.ehr!r}.")
    connector = connect(runtime, organization, bounds or Bounds.batch(runtime.settings))
    if recorder is not None:
        connector.recorder = recorder
    return connector


def practitioner_of(runtime, organization_id: str, user_id: str) -> str | None:
    """The id of the user's Practitioner in the EHR of their clinic (SMART `fhirUser`), or None when
    there is none to point at: no NPI, an NPI the EHR does not know, an EHR svc-auth has no
    connector for, or an EHR that did not answer (logged)."""
    user = User.get_or_none((User.id == user_id) & (User.organization == organization_id))
    organization = Organization.get_or_none(Organization.id == organization_id)
    if user is None or organization is None or not user.npi:
        return None
    try:
        connector = connector_for(runtime, organization, Bounds.interactive(runtime.settings))  # a token waits
        return connector.user_practitioner(Provider(user_id=user.id, npi=user.npi, name=user.display_name,
                                                    ehr_username=user.ehr_username))
    except ConnectorError as exc:
        log.warning("fhirUser: no Practitioner for user %s of %s: %s", user.id, organization_id, exc)
        return None
