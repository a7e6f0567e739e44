"""One organization's FHIR EHR behind the connector interface (see `connectors.fhir`)."""
from __future__ import annotations

import datetime as dt
import itertools
import logging

from connectors.base import Chart, ConnectorError, PatientNotFound, Provider, ResourceNotFound, ResourceQuery
from connectors.bounds import Bounds
from connectors.fhir import check as ehr_check
from connectors.fhir.cache import FhirState
from connectors.fhir.client import CAPABILITIES_SECONDS, AccessRefused, FhirClient, RequestRefused
from connectors.fhir.mapping import LISTED_STATUSES, appointment_of, patient_of, relative_references
from connectors.fhir.query import FHIR_ID, NPI_SYSTEM, PAGE_SIZE, RESOURCE_TYPE, instant, search_params
from connectors.fhir.spool import CHART_TYPES, ChartSpool

log = logging.getLogger("svc_auth.connectors.fhir")


class FhirConnector:
    """One organization's FHIR EHR, behind the connector interface."""

    def __init__(self, organization, client: FhirClient):
        self.organization = organization
        self.client = client

    def practitioner_id(self, npi: str) -> str | None:
        """The FHIR id of the Practitioner with this NPI, or None when the EHR has none."""
        bundle = self.client.search("Practitioner", {"identifier": f"{NPI_SYSTEM}|{npi}", "_elements": "id"})
        ids = [e["resource"]["id"] for e in bundle.get("entry") or () if e.get("resource", {}).get("resourceType")
               == "Practitioner"]
        if len(ids) > 1:
            log.warning("%d practitioners have NPI %s in %s; using the first", len(ids), npi, self.organization.id)
        return ids[0] if ids else None

    def fetch_appointments(self, provider: Provider, start: dt.datetime, end: dt.datetime):
        practitioner = self.practitioner_id(provider.npi)
        if practitioner is None:
            log.warning("no Practitioner with NPI %s in the EHR of %s: no appointments", provider.npi,
                        self.organization.id)
            return
        params = {"practitioner": f"Practitioner/{practitioner}", "date": [f"ge{instant(start)}", f"lt{instant(end)}"],
                  "status": ",".join(LISTED_STATUSES), "_include": "Appointment:patient", "_count": PAGE_SIZE}
        for page in self.client.pages("Appointment", params):  # a page at a time: memory stays flat
            resources = [entry.get("resource") or {} for entry in page.get("entry") or ()]
            patients = {f"Patient/{r.get('id')}": r for r in resources if r.get("resourceType") == "Patient"}
            for resource in resources:
                if resource.get("resourceType") == "Appointment":
                    mapped = appointment_of(resource, patients)
                    if mapped is not None:
                        yield mapped

    def check(self, npi: str | None, now: dt.datetime) -> list[dict]:
        """`svc-auth ehr check` (`connectors.fhir.check`)."""
        return ehr_check.check(self, npi, now)

    def fetch_chart(self, patient_id: str) -> Chart:
        """The patient's chart: the Patient, then its resources (`chart_resources`) spooled page by
        page; the PDF and JSON read encounters, observations and documents back from the spool."""
        if not FHIR_ID.fullmatch(patient_id or ""):
            raise PatientNotFound(f"No patient has id {patient_id!r} in this EHR.")
        try:
            resource = self.client.get(f"Patient/{patient_id}")
        except LookupError:
            raise PatientNotFound(f"No patient has id {patient_id!r} in this EHR.") from None
        patient = patient_of(resource)
        if patient.date_of_birth is None:
            raise ConnectorError(f"Patient {patient_id} has no birthDate in the EHR; a chart needs it.")
        spool = ChartSpool(patient_id)
        try:
            for resource in self.chart_resources(patient_id):
                spool.add(resource)
        except BaseException:
            spool.close()
            raise
        if spool.left_out:
            log.warning("%d resources read for Patient %s name another patient: left out", spool.left_out, patient_id)
        return Chart(patient=patient, organization_name=self.organization.name, problems=spool.problems,
                     medications=spool.medications, allergies=spool.allergies,
                     encounter_source=lambda: spool.read("encounters"),
                     observation_source=lambda: spool.read("observations"),
                     document_source=lambda: spool.read("documents"))

    def chart_resources(self, patient_id: str):
        """The patient's chart resources, a page at a time: `$everything` where the EHR offers it,
        else one search by patient per type of `CHART_TYPES`."""
        if self.client.offers_everything():
            params = {"_type": ",".join(CHART_TYPES), "_count": PAGE_SIZE}
            pages = self.client.pages(f"Patient/{patient_id}/$everything", params)
            try:
                first = next(pages)
            except (LookupError, RequestRefused, AccessRefused) as exc:  # listed, yet refused to this client
                # (a registration refused altogether fails the searches below with what to fix)
                log.warning("the EHR at %s refused $everything (%s): charts use searches", self.client.base, exc)
                self.client.capabilities.put(self.client.base, False, CAPABILITIES_SECONDS)
            else:
                for page in itertools.chain((first,), pages):
                    for entry in page.get("entry") or ():
                        yield entry.get("resource") or {}
                return
        of_patient = {"patient": f"Patient/{patient_id}", "_count": PAGE_SIZE}
        for resource_type in CHART_TYPES:
            yield from self._all(resource_type, of_patient)

    def _all(self, resource_type: str, params: dict):
        """The matches of a search of `resource_type`, following its pages lazily."""
        for page in self.client.pages(resource_type, params):
            for entry in page.get("entry") or ():
                resource = entry.get("resource") or {}
                mode = (entry.get("search") or {}).get("mode", "match")  # not an `include`d or `outcome` entry
                if resource.get("resourceType") == resource_type and mode == "match":
                    yield resource

    def read_resource(self, resource_type: str, resource_id: str) -> dict:
        """`GET {base}/{type}/{id}`; `ResourceNotFound` when the EHR has none (404, 410) or the id
        cannot be a FHIR id."""
        if not RESOURCE_TYPE.fullmatch(resource_type or "") or not FHIR_ID.fullmatch(resource_id or ""):
            raise ResourceNotFound(f"No {str(resource_type)[:64]} has id {str(resource_id)[:64]!r} in this EHR.")
        try:
            resource = self.client.get(f"{resource_type}/{resource_id}")
        except LookupError:
            raise ResourceNotFound(f"No {resource_type} has id {resource_id!r} in this EHR.") from None
        if resource.get("resourceType") != resource_type or resource.get("id") != resource_id:
            raise ResourceNotFound(f"No {resource_type} has id {resource_id!r} in this EHR.")
        return relative_references(resource, self.client.base)

    def search_resources(self, query: ResourceQuery):
        """The resources matching `query`, from `query.offset` on, in the EHR's order; pages are
        read only as the caller iterates. A query the EHR cannot answer for the type matches nothing."""
        params = search_params(query)
        if params is None:
            return iter(())
        found = self._all(query.resource_type, {**params, "_count": PAGE_SIZE})
        return (relative_references(r, self.client.base) for r in itertools.islice(found, query.offset, None))


def connect(runtime, organization, bounds: Bounds | None = None) -> FhirConnector:
    """The clinic's FHIR connector, held to the caller's `bounds` (default: `Bounds.batch`)."""
    if not organization.ehr_url:
        raise ConnectorError(f"Organization {organization.id} is on FHIR but has no FHIR base URL "
                             f"(svc-auth orgs update --org {organization.id} --fhir-base-url URL).")
    if organization.fhir_auth != "none" and not organization.fhir_client_id:
        raise ConnectorError(f"Organization {organization.id} has no FHIR client id "
                             f"(svc-auth orgs update --org {organization.id} --fhir-client-id ID).")
    state = runtime.connector_state("fhir", FhirState)
    client = FhirClient(organization.ehr_url, organization.fhir_client_id, organization.fhir_auth,
                        runtime.ehr_keys, state.tokens, state.capabilities, bounds or Bounds.batch(runtime.settings))
    return FhirConnector(organization, client)
