"""Read and search through the clinic's connector, within what the caller may see.

Blocking (database, the EHR): handlers await these on the runtime pool. The connector is held to
`Bounds.interactive` (the whole call within `SVC_EHR_INTERACTIVE_DEADLINE`). A connector that is
down answers 503 with Retry-After; the EHR past the deadline 504; past another bound (size, pages,
a repeated or foreign `next`, a redirect) 502; an error OperationOutcome from the EHR 502; a
permanent connector failure (the EHR refusing svc-auth: a revoked registration, a refused request)
502; a missing resource 404. The connector's own words (the EHR's host, svc-auth's client id there)
go to the log for the operator, never to the app.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging

from connectors import (BoundExceeded, Bounds, ConnectorError, ConnectorUnavailable, DeadlineExceeded, EhrReportedError,
                        PatientNotFound, ResourceNotFound, connector_for)
from connectors.matching import matches as resource_matches
from fhir_api import fhir_base_url
from fhir_api.access import Caller, grant_for, in_compartment
from fhir_api.bundle import search_url, searchset
from fhir_api.codes import matches as codes_match, token_filters
from fhir_api.outcome import FhirError, not_found
from fhir_api.search import SUPPORTED_TYPES, Unmatchable, parse_search, resource_id
from models.directory import Organization

RETRY_AFTER_SECONDS = 5
TOTAL_SCAN_LIMIT = 1000
"""Past one page, at most this many further matches are counted for `total`; beyond, it is left out."""

log = logging.getLogger("svc_auth.fhir_api")


def supported_type(resource_type: str) -> str:
    if resource_type not in SUPPORTED_TYPES:
        raise FhirError(404, "not-supported", f"{resource_type[:64]} is not served here; types: "
                                              f"{', '.join(SUPPORTED_TYPES)}.")
    return resource_type


def _connector(runtime, caller: Caller):
    """The connector of the caller's clinic: the one the gate read with the user (no query), else looked up."""
    user = caller.user
    organization = getattr(user, "organization", None) if user is not None else None
    if organization is None or organization.id != caller.organization_id:
        organization = Organization.get_or_none(Organization.id == caller.organization_id)
    if organization is None:
        raise FhirError(404, "not-found", "No such FHIR base.")
    return connector_for(runtime, organization, Bounds.interactive(runtime.settings))


def _failure(organization_id: str, exc: ConnectorError) -> FhirError:
    """The app's answer to a connector failure (its details logged for the operator)."""
    if isinstance(exc, ConnectorUnavailable):
        log.warning("FHIR API: the EHR of %s is unavailable: %s", organization_id, exc)
        return FhirError(503, "transient", "The clinic's EHR is unavailable; try again later.",
                         {"Retry-After": str(RETRY_AFTER_SECONDS)})
    if isinstance(exc, DeadlineExceeded):
        log.warning("FHIR API: the EHR of %s did not answer in time: %s", organization_id, exc)
        return FhirError(504, "timeout", "The clinic's EHR did not answer in time.")
    if isinstance(exc, BoundExceeded):
        log.error("FHIR API: the EHR of %s went past a bound (%s): %s", organization_id, exc.bound, exc)
        return FhirError(502, "exception", "The clinic's EHR answered beyond what svc-auth accepts (too large, too "
                                           "many pages, or a link outside the clinic's FHIR base).")
    if isinstance(exc, EhrReportedError):
        log.error("FHIR API: the EHR of %s reported an error: %s", organization_id, exc)
        return FhirError(502, "exception", "The clinic's EHR reported an error.")
    log.error("FHIR API: the EHR of %s failed for good: %s", organization_id, exc)
    return FhirError(502, "exception", "The clinic's EHR refused svc-auth's request (not worth retrying): the "
                                       "clinic's administrator must check svc-auth's access to its EHR.")


def _counted(matches, total: int) -> int | None:
    """`total` plus the matches after the page, or None past `TOTAL_SCAN_LIMIT` or when counting
    them would take the EHR past a bound (the page itself is whole: it is served without a total)."""
    try:
        rest = sum(1 for _ in itertools.islice(matches, TOTAL_SCAN_LIMIT + 1))
    except BoundExceeded as exc:
        log.warning("FHIR API: the total was left out: %s", exc)
        return None
    return None if rest > TOTAL_SCAN_LIMIT else total + rest


def read(runtime, caller: Caller, resource_type: str, raw_id: str) -> dict:
    """`GET {iss}/{Type}/{id}`: the resource, or 404 (also for one outside a patient/ grant)."""
    grant = grant_for(caller, supported_type(resource_type), "r")
    ident = resource_id(raw_id)
    try:
        resource = _connector(runtime, caller).read_resource(resource_type, ident)
    except (ResourceNotFound, PatientNotFound):
        raise not_found(resource_type, ident) from None
    except ConnectorError as exc:
        raise _failure(caller.organization_id, exc) from None
    if resource.get("resourceType") != resource_type or resource.get("id") != ident:
        raise not_found(resource_type, ident)
    if grant.patient is not None and not in_compartment(resource, grant.patient):
        raise not_found(resource_type, ident)  # another patient's resource is indistinguishable from none
    return resource


def search(runtime, caller: Caller, resource_type: str, args: dict[str, list[str]]) -> dict:
    """`GET {iss}/{Type}?params`: one page of matches as a searchset Bundle."""
    grant = grant_for(caller, supported_type(resource_type), "s")
    base = fhir_base_url(runtime.settings, caller.organization_id)
    args = {name: values for name, values in args.items() if name != "_format"}
    self_url = search_url(base, resource_type, args)
    try:
        query = parse_search(resource_type, args, base)
        if grant.patient is not None:
            if query.patient not in (None, grant.patient):
                raise Unmatchable()
            query = dataclasses.replace(query, patient=grant.patient)
    except Unmatchable:
        return searchset(base, [], 0, self_url, None)
    filters = token_filters(args)
    try:
        # Every answer passes the one matcher (an EHR that ignored a parameter widens nothing, and
        # a patient/ grant holds whatever the EHR sent) and the coding filters, so the connector
        # pages from 0 and the offset is ours.
        found = _connector(runtime, caller).search_resources(dataclasses.replace(query, offset=0))
        matches = (r for r in found if resource_matches(r, query) and (not filters or codes_match(r, filters)))
        matches = itertools.islice(matches, query.offset, None)
        page = list(itertools.islice(matches, query.count + 1))
        more = len(page) > query.count
        total = query.offset + len(page)
        if more:
            total = _counted(matches, total)
    except PatientNotFound:
        return searchset(base, [], 0, self_url, None)
    except ConnectorError as exc:
        raise _failure(caller.organization_id, exc) from None
    next_url = search_url(base, resource_type, args, _count=query.count, _offset=query.offset + query.count) if more else None
    return searchset(base, page[:query.count], total, self_url, next_url)
