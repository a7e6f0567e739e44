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

from audit.disclosures import Later
from connectors import (NO_VALID_ID, BoundExceeded, Bounds, ConnectorError, ConnectorUnavailable, Criterion,
                        DeadlineExceeded, EhrReportedError, PatientNotFound, ResourceNotFound, ResourceQuery,
                        TypeNotGranted, connector_for)
from connectors.compartment import in_patient_compartment
from connectors.matching import matches as resource_matches, reference_id, values_at
from errors import ApiError
from fhir_api import fhir_base_url
from fhir_api.access import Caller, Grant, grant_for, in_compartment, read_grant
from fhir_api.bundle import search_url, searchset
from fhir_api.cursor import CURSOR_PARAM, Position, binding, seal, unseal
from fhir_api.outcome import FhirError, invalid, not_found, operation_outcome
from fhir_api.search import SUPPORTED_TYPES, for_patient, parse_search, resource_id
from models.directory import Organization
from models.fhir_grammar import is_resource_type

RETRY_AFTER_SECONDS = 5
MAX_REVINCLUDED = 100
"""At most this many `_revinclude`d resources per page."""
TOTAL_SCAN_LIMIT = 1000
"""Past one page, at most this many further matches are counted for `total`; beyond, it is left out."""
TOTAL_EHR_PAGES = 2
"""On a FHIR clinic, at most this many more EHR pages are read to count `total`; beyond, it is left out."""

log = logging.getLogger("svc_auth.fhir_api")


def supported_type(resource_type: str) -> str:
    """`resource_type` when it is served, else 404 `not-supported` (naming it only when it is a
    resource type's name, `models.fhir_grammar`: any other path segment is not echoed)."""
    if resource_type not in SUPPORTED_TYPES:
        named = resource_type if is_resource_type(resource_type) else "That resource type"
        raise FhirError(404, "not-supported", f"{named} is not served here; types: {', '.join(SUPPORTED_TYPES)}.")
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


def not_granted(resource_type: str) -> str:
    """What the app is told of a type the clinic's EHR has not granted svc-auth."""
    return (f"The clinic's EHR has not granted svc-auth access to {resource_type}: its administrator must grant "
            f"svc-auth's registration the system/{resource_type} scope.")


def _failure(organization_id: str, exc: ConnectorError) -> FhirError:
    """The app's answer to a connector failure (its details logged for the operator)."""
    if isinstance(exc, TypeNotGranted):
        return FhirError(403, "forbidden", not_granted(exc.resource_type))
    if isinstance(exc, ConnectorUnavailable):
        log.warning("FHIR API: the EHR of %s is unavailable: %s", organization_id, exc)
        return FhirError(503, "transient", "The clinic's EHR is unavailable; try again later.",
                         {"Retry-After": str(RETRY_AFTER_SECONDS)})
    if isinstance(exc, DeadlineExceeded):
        log.warning("FHIR API: the EHR of %s did not answer in time: %s", organization_id, exc)
        return FhirError(504, "timeout", "The clinic's EHR did not answer in time.")
    if isinstance(exc, BoundExceeded):
        log.error("FHIR API: the EHR of %s went past a bound (%s): %s", organization_id, exc.bound, exc)
        return FhirError(502, "exception", "The clinic's EHR answered beyond what svc-auth accepts (too large or "
                                           "dense, too many pages, or a link outside the clinic's FHIR base).")
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


def read(runtime, caller: Caller, resource_type: str, raw_id: str):
    """`GET {iss}/{Type}/{id}`: the resource, or 404 (also for one outside a patient/ grant). On a
    connector whose reads can finish on the IOLoop (`reads_on_loop`: a FHIR clinic), a `Later` whose
    exchange with the EHR blocks no pool thread, checked there as here. The user's own Practitioner
    (`fhirUser`) needs only the `fhirUser` scope (`fhir_api.access.read_grant`)."""
    ident = resource_id(raw_id)
    grant = read_grant(caller, supported_type(resource_type), ident,
                       fhir_base_url(runtime.settings, caller.organization_id))
    connector = _connector(runtime, caller)
    if not connector.reads_on_loop:
        return _read(caller, grant, resource_type, ident, lambda: connector.read_resource(resource_type, ident))
    exchange = _fetched(caller, lambda: connector.read_later(resource_type, ident), resource_type, ident)
    return Later(exchange, lambda fetched: _read(caller, grant, resource_type, ident, fetched))


def _read(caller: Caller, grant: Grant, resource_type: str, ident: str, fetch) -> dict:
    """The read's answer: what `fetch()` gives when the caller may see it, else its error (404, 502...)."""
    resource = _fetched(caller, fetch, resource_type, ident)
    if resource.get("resourceType") != resource_type or resource.get("id") != ident:
        raise not_found(resource_type, ident)
    if grant.patient is not None and not in_compartment(resource, grant.patient):
        raise not_found(resource_type, ident)  # another patient's resource is indistinguishable from none
    return resource


def _fetched(caller: Caller, fetch, resource_type: str, ident: str):
    """`fetch()`, a connector's error as the app's answer."""
    try:
        return fetch()
    except (ResourceNotFound, PatientNotFound):
        raise not_found(resource_type, ident) from None
    except ConnectorError as exc:
        raise _failure(caller.organization_id, exc) from None


def search(runtime, caller: Caller, resource_type: str, args: dict[str, list[str]], strict: bool = False) -> dict:
    """`GET {iss}/{Type}?params`: one page of matches as a searchset Bundle, with the `_include`d
    and `_revinclude`d resources the caller may see (`strict`: `Prefer: handling=strict`). A
    match the EHR answered without a valid id cannot be served (its URL would be invalid): the
    connector leaves it out, counted as what cannot be listed (`connectors.NO_VALID_ID`), the rest
    is served, and the Bundle says how many in a warning OperationOutcome (`_left_out`): never a
    500, nor a 502 (as an entry of another type or mode, it is not the answer's to serve)."""
    grant = grant_for(caller, supported_type(resource_type), "s")
    base = fhir_base_url(runtime.settings, caller.organization_id)
    args = {name: values for name, values in args.items() if name != "_format"}
    asked = parse_search(resource_type, args, base, strict)
    self_url = search_url(base, resource_type, asked.applied)
    query = asked.query
    if grant.patient is not None and not asked.unmatchable:
        query = for_patient(query, grant.patient)
    if asked.unmatchable or query is None:
        return searchset(base, [], 0, self_url, None)
    connector = _connector(runtime, caller)
    if getattr(connector, "search_pages", None) is not None and query.offset == 0:
        return _search_by_position(runtime, caller, connector, asked, query, base, self_url)
    if CURSOR_PARAM in asked.applied:
        raise invalid(f"{CURSOR_PARAM} is not a paging position of this clinic's searches; follow the Bundle's "
                      f"next link as given.")
    try:
        # Every answer passes the one matcher (an EHR that ignored a parameter widens nothing, and
        # a patient/ grant holds whatever the EHR sent), so the connector pages from 0 and the offset is ours.
        # A connector whose answers already passed it for this very query (the sandbox) is not checked twice.
        matches = iter(connector.search_resources(dataclasses.replace(query, offset=0)))
        if not connector.answers_matched:
            matches = (r for r in matches if resource_matches(r, query))
        skipped = sum(1 for _ in itertools.islice(matches, query.offset))  # fewer: `_offset` is past the end
        page = list(itertools.islice(matches, query.count + 1))
        more = len(page) > query.count
        total = skipped + len(page)
        if more:
            total = _counted(matches, total)
        page = page[:query.count]
        included, outcomes = included_resources(connector, caller, asked, page)
        outcomes += _left_out(connector)
    except PatientNotFound:
        return searchset(base, [], 0, self_url, None)
    except BoundExceeded as exc:
        if exc.bound == "max_pages" and query.offset:  # the app's own `_offset`, read from the EHR's first page
            raise invalid(f"_offset={query.offset} reads past the pages of this clinic's EHR one request may read; "
                          f"follow the Bundle's next link (its {CURSOR_PARAM} starts where a page ended).") from None
        raise _failure(caller.organization_id, exc) from None
    except ConnectorError as exc:
        raise _failure(caller.organization_id, exc) from None
    next_url = search_url(base, resource_type, asked.applied, _count=query.count,
                          _offset=query.offset + query.count) if more else None
    return searchset(base, page, total, self_url, next_url, included, outcomes)


def _search_by_position(runtime, caller: Caller, connector, asked, query: ResourceQuery, base: str,
                        self_url: str) -> dict:
    """A page of a search through a connector that pages by the EHR's own position (a FHIR clinic):
    from the `_cursor` of the previous page's `next` link (`fhir_api.cursor`), reading only the EHR
    pages this page needs; `total` when the search ends on this page or within `TOTAL_EHR_PAGES`
    more EHR pages, else left out."""
    bound = binding(caller.organization_id, caller.patient, query.resource_type, asked.applied)
    raw = asked.applied.get(CURSOR_PARAM)
    now = runtime.clock.time()
    position = unseal(runtime.hasher, raw[0], bound, now) if raw else Position()
    page, after, rest, tail = [], None, 0, None
    try:
        pages = connector.search_pages(query, position.link)
        skip = position.skip
        for url, found, following in pages:
            matched = [r for r in found if resource_matches(r, query)]
            start, skip = skip, 0
            room = query.count - len(page)
            if len(matched) - start > room:
                page += matched[start:start + room]
                after = Position(url, start + room, position.served + len(page))
                rest, tail = len(matched) - start - room, following
                break
            page += matched[start:]
            if len(page) == query.count and following:
                after = Position(following, 0, position.served + len(page))
                tail = following
                break
        served = position.served + len(page)
        total = served if after is None else _counted_pages(pages, query, served + rest, tail)
        included, outcomes = included_resources(connector, caller, asked, page)
        outcomes += _left_out(connector)
    except PatientNotFound:
        return searchset(base, [], 0, self_url, None)
    except ConnectorError as exc:
        raise _failure(caller.organization_id, exc) from None
    next_url = None
    if after is not None:
        applied = {name: values for name, values in asked.applied.items() if name != CURSOR_PARAM}
        next_url = search_url(base, query.resource_type, applied, _count=query.count,
                              _cursor=seal(runtime.hasher, after, bound, now))
    return searchset(base, page, total, self_url, next_url, included, outcomes)


def _counted_pages(pages, query: ResourceQuery, total: int, following: str | None) -> int | None:
    """`total` plus the matches of at most `TOTAL_EHR_PAGES` more EHR pages, or None when the search
    goes on past them (or counting would take the EHR past a bound)."""
    if following is None:
        return total
    try:
        for _ in range(TOTAL_EHR_PAGES):
            item = next(pages, None)
            if item is None:
                return total
            _, found, following = item
            total += sum(1 for r in found if resource_matches(r, query))
            if following is None:
                return total
    except ConnectorError as exc:
        log.warning("FHIR API: the total was left out: %s", exc)
    return None


def _left_out(connector) -> list[dict]:
    """The Bundle's warning OperationOutcome (`incomplete`) counting the matches (page, includes,
    `total`'s count) this call's connector left out for want of a valid id (`connectors.NO_VALID_ID`)."""
    skipped = getattr(connector, "skipped", None)
    count = skipped.count(NO_VALID_ID) if skipped is not None else 0
    if not count:
        return []
    return [operation_outcome("incomplete", f"The clinic's EHR answered {count} resource{'s' if count > 1 else ''} "
                                            f"without a valid id (FHIR requires one): left out.", "warning")]


def _may(caller: Caller, resource_type: str, permission: str) -> Grant | None:
    """The caller's grant on `resource_type`, or None when its scopes do not reach it (an include
    the token may not see is left out, never an error: neither its 403 `insufficient_scope` nor `forbidden`)."""
    try:
        return grant_for(caller, resource_type, permission)
    except ApiError:
        return None


def included_resources(connector, caller: Caller, asked, page: list[dict]):
    """(resources, outcomes): the `_include`d resources (read by reference) and `_revinclude`d ones
    (searched by their reference to the page) that the caller's scopes reach; under a `patient/`
    grant of their type only those in the patient's compartment, or (a Provenance) whose every
    target is the patient or a page resource that grant reaches (`_revincluded`). A type the
    clinic's EHR has not granted svc-auth is left out, and said in an OperationOutcome
    (`outcomes`: the Bundle's `search.mode` `outcome` entries)."""
    found, outcomes = [], []
    for value, kind, path in asked.includes:
        try:
            found += _included(connector, caller, kind, path, page, found)
        except TypeNotGranted as exc:
            outcomes.append(operation_outcome("forbidden", f"_include={value} left out: " + not_granted(
                exc.resource_type), "warning"))
    for value, kind, name in asked.revincludes:
        try:
            found += _revincluded(connector, caller, kind, name, page, found)
        except TypeNotGranted as exc:
            outcomes.append(operation_outcome("forbidden", f"_revinclude={value} left out: " + not_granted(
                exc.resource_type), "warning"))
    return found, outcomes


def _included(connector, caller: Caller, kind: str, path, page: list[dict], already: list[dict]) -> list[dict]:
    """The resources of type `kind` the page references at `path`, that the caller may read."""
    found, seen = [], {(r["resourceType"], r["id"]) for r in (*page, *already)}
    may = _may(caller, kind, "r")
    if may is None:
        return found
    for resource in page:
        for value in values_at(resource, path):
            ident = reference_id(value.get("reference") if isinstance(value, dict) else None, kind)
            if ident is None or (kind, ident) in seen:
                continue
            seen.add((kind, ident))
            try:
                other = connector.read_resource(kind, ident)
            except ResourceNotFound:
                continue
            if may.patient is None or in_compartment(other, may.patient):
                found.append(other)
    return found


def _revincluded(connector, caller: Caller, kind: str, name: str, page: list[dict], already: list[dict]) -> list[dict]:
    """The resources of type `kind` whose `name` references the page, that the caller may see: under
    a `patient/` grant of `kind`, only those whose every reference is that patient or a resource of
    the page that grant reaches (in the patient's compartment, or of a type outside every
    patient's: the page of a `user/` grant of its own type holds other patients' resources)."""
    found, seen = [], {(r["resourceType"], r["id"]) for r in (*page, *already)}
    targets = tuple((r["resourceType"], r["id"]) for r in page)
    may = _may(caller, kind, "s")
    if may is None or not targets:
        return found
    on_page = {f"{r['resourceType']}/{r['id']}" for r in page if may.patient is None
               or not in_patient_compartment(r["resourceType"]) or in_compartment(r, may.patient)}
    on_page |= {f"Patient/{may.patient}"} if may.patient else set()
    query = ResourceQuery(kind, criteria=(Criterion(name, "reference", targets),), count=MAX_REVINCLUDED)
    for resource in itertools.islice(connector.search_resources(query), MAX_REVINCLUDED):
        if (kind, resource.get("id")) in seen or not resource_matches(resource, query):
            continue
        references = [t.get("reference") if isinstance(t, dict) else None for t in values_at(resource, (name,))]
        if may.patient is not None and not all(r in on_page for r in references):
            continue
        seen.add((kind, resource.get("id")))
        found.append(resource)
    return found
