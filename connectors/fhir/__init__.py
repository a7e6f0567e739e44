"""The FHIR R4 connector (`ehr: fhir`): a clinic's EHR over HL7 FHIR R4 (US Core), reached with
SMART Backend Services. FHIR search syntax is `query.py`'s alone.

An organization on `fhir` has a FHIR base URL (`ehr_url`), svc-auth's client id at that EHR
(`fhir_client_id`) and `fhir_auth`: `smart-backend` (default) or `none` (an open test server).

- **Authentication** (SMART Backend Services): the token endpoint comes from
  `{base}/.well-known/smart-configuration`; the token from the `client_credentials` grant with a
  `private_key_jwt` client assertion (RFC 7523: `iss` = `sub` = client id, `aud` = the token
  endpoint, a unique `jti`, `exp` 5 minutes ahead, RS384, the `kid` of a key published at
  `{SVC_ISSUER}/ehr/jwks.json`). Tokens are cached per runtime until shortly before they expire,
  and renewed once when the EHR answers 401.
- **Appointments**: the Practitioner by NPI (`identifier=http://hl7.org/fhir/sid/us-npi|<npi>`),
  then its Appointments in the window with `_include=Appointment:patient` (no query per patient),
  following the Bundle's `next` links. Listed statuses: `LISTED_STATUSES`; the others are not.
- **Charts**: the Patient, then its resources page by page: `Patient/{id}/$everything` where the
  EHR's CapabilityStatement (`{base}/metadata`, read once per runtime and base, cached an hour)
  offers an operation `everything` on Patient and does not refuse it (a 4xx on its first page
  makes the connector fall back, remembered for the hour); else searches by patient of `CHART_TYPES`
  (Condition, MedicationRequest, AllergyIntolerance, Encounter, Observation, DocumentReference).
  Either way each page is spooled to disk (`connectors.fhir.spool`), so the EHR is read once and
  memory stays flat for thousands of resources; the PDF and JSON stream from the spool.
- **The platform FHIR API** (`read_resource`, `search_resources`): a read is `GET {base}/{type}/{id}`
  (404/410: `ResourceNotFound`); a search translates the neutral `ResourceQuery` into this EHR's
  search parameters (`SEARCH_DATE`, `PATIENT_SEARCH`, each `Criterion` by its name) and yields the matches of the asked type
  lazily, page by page; a match without a valid id is left out (counted in `skipped`). Ids, NPIs and types are validated before they reach a URL; a query that
  cannot apply to the type (a date on Practitioner) matches nothing.
- **Vendors** (`connectors.fhir.profiles`): a clinic's `fhir_profile` (generic, epic, oracle,
  athena) holds what its vendor documents and discovery cannot tell (Oracle: no `_include`,
  `-date-or-req-period`, `_id` alone; Epic: Observation by category; athena: a required practice
  parameter); `fhir_scopes` (auto: discovered from the SMART configuration; v1; v2); and
  `fhir_search_params`, appended to every search. Patients an Appointment page did not include
  are read in batches by `_id`; what cannot be listed is counted in `FhirConnector.skipped`; a
  chart type the EHR refuses is named in the chart's `omitted`.
- **Epic's schedule** (`epic_schedule`): Epic documents no FHIR search of a practitioner's
  appointments; a clinic with `--fhir-profile epic --epic-user-id ID` reads each physician's from
  Epic's GetProviderAppointments web service instead (same token, same transport and bounds).
- **Errors**: 401/403 and an OperationOutcome `login`/`forbidden` are permanent
  (`ConnectorError`, saying what to fix); 429, 5xx, timeouts and refused connections are retried
  with backoff, honouring `Retry-After` up to a cap, then raised as `ConnectorUnavailable` (the
  task retries). An OperationOutcome of severity error/fatal where a resource or searchset belongs
  is `EhrReportedError`, never an empty result.
- **Bounds** (`connectors.bounds.Bounds`, chosen by the caller; `transport`): every request under a
  wall-clock deadline (retries and body included), a streamed body up to a size, searches up to a
  number of pages and never the same `next` twice, nothing outside the configured base path, no
  redirect followed; past one, `BoundExceeded` (`DeadlineExceeded`) naming it.
"""
from __future__ import annotations

from connectors.fhir.client import SCOPES, AccessRefused, NotGranted, RequestRefused  # noqa: F401
from connectors.fhir.connector import FhirConnector, connect  # noqa: F401

# The modules, by concern: `transport` (the one door: bounds, the base), `client` (SMART Backend
# Services, reads, paging), `cache` (what the
# connector keeps per process), `capability` (the CapabilityStatement), `query` (FHIR search syntax),
# `mapping` (resources as the interface's records; references), `spool` (a chart's resources),
# `check` (`svc-auth ehr check`), `profiles` (vendor rules, scopes), `connector` (the interface),
# `epic_schedule` (an Epic clinic's schedule from its GetProviderAppointments web service).
