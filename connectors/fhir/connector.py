"""One organization's FHIR EHR behind the connector interface (see `connectors.fhir`)."""
from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import itertools
import json
import logging

from connectors.base import (NO_VALID_ID, Chart, ConnectorError, EhrReportedError, PatientNotFound, Provider, ResourceNotFound,
                             ResourceQuery, Skipped)
from connectors.bounds import Bounds
from connectors.fhir import check as ehr_check
from connectors.fhir.cache import (NO_PRACTITIONER_SECONDS, PRACTITIONER_SECONDS, UNAVAILABLE_SECONDS, ExpiringCache,
                                   FhirState)
from connectors.fhir.capability import ehr_types, offers_bulk_export
from connectors.fhir.client import CAPABILITIES_SECONDS, AccessRefused, FhirClient, RequestRefused
from connectors.fhir.epic_schedule import EpicSchedule, no_schedule_search
from connectors.fhir.mapping import (LISTED_STATUSES, Unlisted, appointment_of, of_practitioner, patient_of,
                                     patient_reference, relative_references, starts_within)
from connectors.fhir.profiles import Profile, profile_named, scope_version, scopes
from connectors.fhir.query import PAGE_SIZE, PATIENT_SEARCH, instant, search_params
from connectors.fhir.spool import CHART_TYPES, ChartSpool
from connectors.fhir.transport import relative_to_base
from connectors.matching import matches
from models.fhir_grammar import is_resource_type
from models.ids import is_id
from models.npi import NPI_SYSTEM, is_npi

log = logging.getLogger("svc_auth.connectors.fhir")
PATIENT_BATCH = 20               # Patients read per `Patient?_id=a,b,...` (those an Appointment page did not include)
KNOWN_PATIENTS = 5000            # Patients kept while one physician's appointments are read


class FhirConnector:
    """One organization's FHIR EHR, behind the connector interface, searched by its vendor's
    `profile` with the clinic's `extra` search parameters appended to every search. `skipped`
    counts what the EHR sent that could not be listed, by reason."""

    answers_matched = False
    """A real EHR's answers pass `connectors.matching.matches` (`connectors.base.Connector`)."""
    reads_on_loop = True
    """`read_later`: a read's exchange with the EHR runs on the IOLoop."""

    def __init__(self, organization, client: FhirClient, profile: Profile | None = None, extra=(),
                 practitioners: ExpiringCache | None = None):
        self.organization = organization
        self.client = client
        self.profile = profile or profile_named("generic")
        self.extra = tuple(extra)
        self.skipped = Skipped()
        self.practitioners = practitioners if practitioners is not None else ExpiringCache(client.transport.wall)
        # Epic's GetProviderAppointments web service, where the clinic gave the Epic user to call it as
        self.epic_schedule = EpicSchedule(self, organization) if self.profile.name == "epic" and getattr(
            organization, "epic_user_id", "") else None

    def search(self, params: dict) -> dict:
        """`params` as this EHR wants them: the clinic's extra parameters appended; with `_id`
        on an EHR where `_id` must be alone (Oracle), no `_count` nor extra parameters."""
        if "_id" in params and self.profile.id_search_alone:
            return {k: v for k, v in params.items() if k != "_count"}
        return {**params, **{name: value for name, value in self.extra if name not in params}}

    @property
    def recorder(self):
        """The disclosure audit's callback (`connectors.connector_for`): the client calls it once per read."""
        return self.client.recorder

    @recorder.setter
    def recorder(self, value) -> None:
        self.client.recorder = value

    def practitioner_id(self, npi: str) -> str | None:
        """The FHIR id of the Practitioner with this NPI, or None when the EHR has none."""
        bundle = self.client.search("Practitioner", self.search({"identifier": f"{NPI_SYSTEM}|{npi}"}))
        found = [e["resource"].get("id") for e in bundle.get("entry") or () if isinstance(e, dict) and isinstance(
            e.get("resource"), dict) and e["resource"].get("resourceType") == "Practitioner"]
        ids = [ident for ident in found if isinstance(ident, str) and is_id(ident)]
        if found and not ids:
            raise ConnectorError(f"The clinic's EHR answered the search for the Practitioner with NPI {npi} "
                                 "with no valid id (FHIR requires one on every resource it returns)")
        if len(ids) > 1:
            log.warning("%d practitioners have NPI %s in %s; using the first", len(ids), npi, self.organization.id)
        return ids[0] if ids else None

    def appointment_search(self, practitioner: str, start: dt.datetime, end: dt.datetime | None) -> dict:
        """The search of a practitioner's listed appointments from `start` (to `end`), by the profile."""
        dates = [f"ge{instant(start)}"] + ([f"lt{instant(end)}"] if end else [])
        params = {"practitioner": f"Practitioner/{practitioner}", self.profile.appointment_date: dates,
                  "status": ",".join(LISTED_STATUSES), "_count": PAGE_SIZE}
        if self.profile.appointment_include:
            params["_include"] = "Appointment:patient"
        return self.search(params)

    def user_practitioner(self, provider: Provider) -> str | None:
        """The id of the user's Practitioner in this EHR, found by NPI, or None when the EHR has
        none (or did not answer: a sign-in does not fail on it). Cached per process by (base, NPI)."""
        if not is_npi(provider.npi):
            return None
        cache, key = self.practitioners, (self.client.base, provider.npi)
        known = cache.get(key)
        if known is not None:
            return known or None
        try:
            found = self.practitioner_id(provider.npi)
        except (ConnectorError, LookupError) as exc:
            log.warning("fhirUser: the EHR of %s did not say which Practitioner has NPI %s (%s)",
                        self.organization.id, provider.npi, exc)
            cache.put(key, "", UNAVAILABLE_SECONDS)
            return None
        found = found if found and is_id(found) else ""
        cache.put(key, found, PRACTITIONER_SECONDS if found else NO_PRACTITIONER_SECONDS)
        return found or None

    def finish_night(self) -> None:
        """After the night's last physician: a `ConnectorError` when what was read cannot be published
        (Epic: every Patient read refused, `EpicSchedule.finish_night`)."""
        if self.epic_schedule is not None:
            self.epic_schedule.finish_night()

    def fetch_appointments(self, provider: Provider, start: dt.datetime, end: dt.datetime):
        if self.epic_schedule is not None:
            yield from self.epic_schedule.fetch_appointments(provider, start, end)
            return
        practitioner = self.practitioner_id(provider.npi)
        if practitioner is None:
            log.warning("no Practitioner with NPI %s in the EHR of %s: no appointments", provider.npi,
                        self.organization.id)
            return
        known: dict[str, dict] = {}
        others = 0   # appointments the search answered that are another's, or outside [start, end)
        try:
            pages = self.client.pages("Appointment", self.appointment_search(practitioner, start, end))
            for page in pages:  # a page at a time: memory stays flat
                resources = [entry["resource"] for entry in page.get("entry") or ()
                             if isinstance(entry, dict) and isinstance(entry.get("resource"), dict)]
                if len(known) > KNOWN_PATIENTS:
                    known.clear()
                known.update({f"Patient/{r.get('id')}": r for r in resources if r.get("resourceType") == "Patient"})
                answered = [r for r in resources if r.get("resourceType") == "Appointment"]
                appointments = [r for r in answered if of_practitioner(r, practitioner, self.client.base)
                                and starts_within(r, start, end)]
                left_out = len(answered) - len(appointments)
                if left_out and not others:   # said once per physician
                    log.warning("the EHR of %s answered the appointment search of Practitioner/%s with "
                                "appointments of other practitioners or outside [%s, %s) (does it ignore a "
                                "search parameter?): left out", self.organization.id, practitioner,
                                instant(start), instant(end))
                others += left_out
                wanted = {patient_reference(a) for a in appointments if a.get("status") in LISTED_STATUSES}
                self._read_patients(sorted(r for r in wanted if r and r not in known), known)
                for resource in appointments:
                    try:
                        mapped = appointment_of(resource, known)
                    except Unlisted as exc:
                        self.skipped.add(str(exc), resource.get("id"))
                        continue
                    except (AttributeError, TypeError, KeyError, IndexError, ValueError):
                        self.skipped.add("malformed appointment", resource.get("id"))
                        continue
                    if mapped is not None:
                        yield mapped
        except RequestRefused as exc:
            if self.profile.schedule_search:
                raise
            raise RequestRefused(f"{exc} ({no_schedule_search(self.profile.label, self.organization.id)})") from None

    def _read_patients(self, references: list[str], known: dict) -> None:
        """Read the Patients an Appointment page named but did not include, `PATIENT_BATCH` at a
        time (`Patient?_id=a,b,c`); an id the EHR does not return stays unknown (skipped, named)."""
        ids = [r.split("/", 1)[1] for r in references if is_id(r.split("/", 1)[1])]
        for first in range(0, len(ids), PATIENT_BATCH):
            batch = ids[first:first + PATIENT_BATCH]
            params = self.search({"_id": ",".join(batch), "_count": len(batch)})
            for page in self.client.pages("Patient", params):
                for entry in page.get("entry") or ():
                    resource = entry.get("resource") if isinstance(entry, dict) else None
                    if isinstance(resource, dict) and resource.get("resourceType") == "Patient" \
                            and resource.get("id") in batch:
                        known[f"Patient/{resource['id']}"] = resource

    def capability_view(self) -> dict:
        """What this EHR offers svc-auth: `granted` (the types its token grants, sorted; None on an
        open server) and `types` (`connectors.fhir.capability.ehr_types` of its CapabilityStatement:
        None when it serves none), and `bulk_export` (whether it offers Bulk Data `$export`:
        `connectors.fhir.capability.offers_bulk_export`). The FHIR API's CapabilityStatement of the
        clinic is built from it; a Bulk Data export of the clinic reads `bulk_export` (`bulk.ehr_export`)."""
        granted = self.client.granted_types()
        try:
            statement = self.client.get("metadata")
        except (LookupError, RequestRefused, AccessRefused, EhrReportedError) as exc:
            log.warning("the EHR at %s serves no CapabilityStatement (%s)", self.client.base, exc)
            statement = None
        return {"granted": sorted(granted) if granted is not None else None, "types": ehr_types(statement),
                "bulk_export": offers_bulk_export(statement)}

    def check(self, npis, now: dt.datetime) -> list[dict]:
        """`svc-auth ehr check` (`connectors.fhir.check`) for these NPIs (in order)."""
        return ehr_check.check(self, npis, now)

    def fetch_chart(self, patient_id: str) -> Chart:
        """The patient's chart: the Patient, then its resources (`chart_resources`) spooled page by
        page; the PDF and JSON read encounters, observations and documents back from the spool."""
        if not is_id(patient_id):
            raise PatientNotFound(f"No patient has id {patient_id!r} in this EHR.")
        try:
            resource = self.client.get(f"Patient/{patient_id}")
        except LookupError:
            raise PatientNotFound(f"No patient has id {patient_id!r} in this EHR.") from None
        try:
            patient = patient_of(resource)
        except Unlisted as exc:
            raise ConnectorError(f"Patient {patient_id} cannot be charted: {exc} in the EHR.") from None
        if patient.date_of_birth is None:
            raise ConnectorError(f"Patient {patient_id} has no birthDate in the EHR; a chart needs it.")
        spool, omitted = ChartSpool(patient_id, self.client.base), []
        try:
            for resource in self.chart_resources(patient_id, omitted):
                spool.add(resource)
        except BaseException:
            spool.close()
            raise
        if spool.left_out:
            log.warning("%d resources read for Patient %s name another patient: left out", spool.left_out, patient_id)
        for omission in spool.omissions():
            log.warning("chart of Patient %s in %s: %s", patient_id, self.organization.id, omission["reason"])
            omitted.append(omission)
        return Chart(patient=patient, organization_name=self.organization.name, problems=spool.problems,
                     medications=spool.medications, allergies=spool.allergies,
                     encounter_source=lambda: spool.read("encounters"),
                     observation_source=lambda: spool.read("observations"),
                     document_source=lambda: spool.read("documents"), omitted=omitted)

    def chart_resources(self, patient_id: str, omitted: list | None = None):
        """The patient's chart resources, a page at a time: `$everything` where the EHR offers it,
        else one search by patient per type of `CHART_TYPES` (Observation: one per category where
        the profile says so). A type the EHR refuses is left out and named in `omitted`
        (`{"resourceType", "reason"}`); when it refuses every type, the chart fails."""
        omitted = [] if omitted is None else omitted
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
                        resource = entry.get("resource") if isinstance(entry, dict) else None
                        if isinstance(resource, dict):  # an entry that is no object is none
                            yield resource
                return
        of_patient = {PATIENT_SEARCH: f"Patient/{patient_id}", "_count": PAGE_SIZE}
        refusals, searches = [], 0
        for resource_type in CHART_TYPES:
            categories = self.profile.observation_categories if resource_type == "Observation" else ()
            seen: set[str] = set()
            for category in categories or (None,):
                params = {**of_patient, "category": category} if category else of_patient
                searches += 1
                try:
                    for resource in self._all(resource_type, params):
                        if category:  # an observation of two categories comes twice
                            if resource.get("id") in seen:
                                continue
                            seen.add(resource.get("id"))
                        yield resource
                except (LookupError, RequestRefused, AccessRefused) as exc:
                    what = f"{resource_type}?category={category}" if category else resource_type
                    reason = f"the EHR refused the search of {what}: {exc}"
                    log.warning("chart of Patient %s in %s: %s; left out", patient_id, self.organization.id, reason)
                    omitted.append({"resourceType": resource_type, "reason": reason[:500]})
                    refusals.append(exc)
        if refusals and len(refusals) == searches:
            raise refusals[0]  # nothing could be read: a refused registration, not a type

    def _all(self, resource_type: str, params: dict):
        """The matches of a search of `resource_type`, following its pages lazily."""
        for page in self.client.pages(resource_type, self.search(params)):
            yield from _matches_of(page, resource_type)

    def _servable(self, resource: dict, query: ResourceQuery) -> bool:
        """Whether a match can be served: its `id` is an id (`models.ids`). One without is left out
        (its URL would be invalid); when it meets `query` (else it was not to be served anyway), it
        is counted in `skipped` under `NO_VALID_ID` (the FHIR API says how many), logged once."""
        if is_id(resource.get("id")):
            return True
        if not matches(resource, query, self.client.base):
            return False
        self.skipped.add(NO_VALID_ID)
        if self.skipped.count(NO_VALID_ID) == 1:
            log.warning("the EHR at %s answered a %s without a valid id (FHIR requires one): left out",
                        self.client.base, str(resource.get("resourceType"))[:64])
        return False

    def read_resource(self, resource_type: str, resource_id: str) -> dict:
        """`GET {base}/{type}/{id}`; `ResourceNotFound` when the EHR has none (404, 410) or the id
        cannot be a FHIR id."""
        self._readable(resource_type, resource_id)
        try:
            resource = self.client.get(f"{resource_type}/{resource_id}")
        except LookupError:
            raise ResourceNotFound(f"No {resource_type} has id {resource_id!r} in this EHR.") from None
        return self._as_read(resource, resource_type, resource_id)

    def read_later(self, resource_type: str, resource_id: str):
        """`read_resource` with its exchange left to the running IOLoop (`FhirClient.get_later`):
        prepared here, blocking -> `read(offload)`, a coroutine function giving what `read_resource` gives."""
        self._readable(resource_type, resource_id)
        fetched = self.client.get_later(f"{resource_type}/{resource_id}")

        async def read(offload) -> dict:
            try:
                resource = await fetched(offload)
            except LookupError:
                raise ResourceNotFound(f"No {resource_type} has id {resource_id!r} in this EHR.") from None
            return self._as_read(resource, resource_type, resource_id)
        return read

    @staticmethod
    def _readable(resource_type: str, resource_id: str) -> None:
        if not is_resource_type(resource_type) or not is_id(resource_id):
            raise ResourceNotFound(f"No {str(resource_type)[:64]} has id {str(resource_id)[:64]!r} in this EHR.")

    def _as_read(self, resource: dict, resource_type: str, resource_id: str) -> dict:
        """The EHR's answer to a read, when it is the resource asked for (its type and id), references made relative."""
        if resource.get("resourceType") != resource_type or resource.get("id") != resource_id:
            raise ResourceNotFound(f"No {resource_type} has id {resource_id!r} in this EHR.")
        return relative_references(resource, self.client.base)

    def search_resources(self, query: ResourceQuery):
        """The resources matching `query`, from `query.offset` on, in the EHR's order; pages are
        read only as the caller iterates. A query the EHR cannot answer for the type matches nothing.
        A match without a valid id is left out and counted (`_servable`), never served nor a failure."""
        params = search_params(query)
        if params is None:
            return iter(())
        found = (r for r in self._criteria_or_not(query, params) if self._servable(r, query))
        return (relative_references(r, self.client.base) for r in itertools.islice(found, query.offset, None))

    def search_pages(self, query: ResourceQuery, link: str | None = None):
        """The search of `query` an EHR page at a time, from its first page, or from `link` (an EHR
        page's URL this method yielded earlier, kept by the FHIR API's signed cursor): (the page's
        URL, its matches of the asked type, the EHR's `next` link or None), both relative to the
        base. Only the pages the caller iterates are read. As `search_resources`, a first page
        refused with every parameter is asked again without the `Criterion`s (the FHIR API's
        matcher applies them), and a match without a valid id is left out and counted."""
        kind = query.resource_type
        if link is not None:
            link = self.client.url(link) if "://" not in link else ""
            if not link or not is_resource_type(kind) or self.client.type_of(link) != kind:
                raise ResourceNotFound(f"That paging position is not a search of {kind}.")
            yield from self._page_matches(query, link)
            return
        params = search_params(query)
        if params is None:
            return
        first = self.client.url(kind, self.search({**params, "_count": PAGE_SIZE}))
        pages = self._page_matches(query, first)
        try:
            page = next(pages, None)
        except RequestRefused as exc:
            if not query.criteria:
                raise
            log.warning("the EHR at %s refused a %s search with %s (%s): searching without them", self.client.base,
                        kind, ", ".join(c.name for c in query.criteria), exc)
            narrower = search_params(dataclasses.replace(query, criteria=()))
            pages = self._page_matches(query, self.client.url(kind, self.search({**narrower, "_count": PAGE_SIZE})))
            page = next(pages, None)
        if page is not None:
            yield page
            yield from pages

    def _page_matches(self, query: ResourceQuery, url: str):
        """(page URL, matches of `query`'s type, next link) of each page from `url`, the URLs
        relative to the base (`Observation?…`: a position never names the EHR's host)."""
        base, kind = self.client.base, query.resource_type
        for page_url, bundle, following in self.client.linked_pages(kind, url):
            if following is not None:
                following = relative_to_base(self.client.transport.confine(following), base)
            page_url = relative_to_base(page_url, base)
            found = [relative_references(r, base) for r in _matches_of(bundle, kind) if self._servable(r, query)]
            yield page_url, found, following

    def _criteria_or_not(self, query: ResourceQuery, params: dict):
        """The search with every parameter; an EHR that refuses it (400: a parameter it does not
        support) before its first match is asked again without the `Criterion`s, which the FHIR
        API's matcher applies to what comes back (logged: the EHR then sends more than needed)."""
        found = self._all(query.resource_type, {**params, "_count": PAGE_SIZE})
        if not query.criteria:
            yield from found
            return
        try:
            first = next(found, None)
        except RequestRefused as exc:
            log.warning("the EHR at %s refused a %s search with %s (%s): searching without them", self.client.base,
                        query.resource_type, ", ".join(c.name for c in query.criteria), exc)
            narrower = search_params(dataclasses.replace(query, criteria=()))
            yield from self._all(query.resource_type, {**narrower, "_count": PAGE_SIZE})
            return
        if first is not None:
            yield first
            yield from found


def _matches_of(bundle: dict, kind: str) -> list[dict]:
    """The resources of type `kind` of a searchset page's `match` entries (not an `include`d or
    `outcome` entry; an entry, resource or `search` that is no object is none)."""
    found = []
    for entry in bundle.get("entry") or ():
        resource = entry.get("resource") if isinstance(entry, dict) else None
        search = entry.get("search") if isinstance(entry, dict) else None
        mode = search.get("mode", "match") if isinstance(search, dict) else "match"
        if isinstance(resource, dict) and resource.get("resourceType") == kind and mode == "match":
            found.append(resource)
    return found


def fhir_state(runtime) -> FhirState:
    """The FHIR connector's caches and connections of this process (on the runtime's clock)."""
    return runtime.connector_state("fhir", functools.partial(FhirState, runtime.clock.time))


def connect(runtime, organization, bounds: Bounds | None = None) -> FhirConnector:
    """The clinic's FHIR connector, held to the caller's `bounds` (default: `Bounds.batch`)."""
    if not organization.ehr_url:
        raise ConnectorError(f"Organization {organization.id} is on FHIR but has no FHIR base URL "
                             f"(svc-auth orgs update --org {organization.id} --fhir-base-url URL).")
    if organization.fhir_auth != "none" and not organization.fhir_client_id:
        raise ConnectorError(f"Organization {organization.id} has no FHIR client id "
                             f"(svc-auth orgs update --org {organization.id} --fhir-client-id ID).")
    state = fhir_state(runtime)
    profile = profile_named(getattr(organization, "fhir_profile", None))
    chosen = getattr(organization, "fhir_scopes", "auto")

    def scopes_for(configuration: dict) -> tuple[str, ...]:  # SMART v1 or v2: as set, else discovered
        return scopes(chosen if chosen in ("v1", "v2") else scope_version(configuration, profile))
    client = FhirClient(organization.ehr_url, organization.fhir_client_id, organization.fhir_auth,
                        runtime.ehr_keys, state.tokens, state.capabilities, bounds or Bounds.batch(runtime.settings),
                        http=state.http, scopes=scopes_for, configurations=state.configurations,
                        watchdog=state.watchdog, clock=state.clock, aio=state.aio)
    try:
        extra = [tuple(p) for p in json.loads(getattr(organization, "fhir_search_params", None) or "[]")]
    except ValueError:
        extra = []
    return FhirConnector(organization, client, profile, extra, state.practitioners)
