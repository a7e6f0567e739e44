"""The platform FHIR R4 API for apps (`/fhir/r4/{svcOrganizationId}`): metadata, read and search.

Thin: `fhir_api` decides. Every answer is `application/fhir+json`, errors OperationOutcomes.
CORS: metadata answers any origin; read and search answer the calling application's registered
origins (`oauth/cors.py`), preflight included.

A read or search is one pool job (`fhir_api.admission`): authentication, the caller's origin, the
limits (docs/fhir-api.md: one limiter call per request, per app and clinic and per token; 429
`throttled` + Retry-After, `RateLimit-*` headers on every answer after it), a slot of the clinic's
EHR in this process (none free: 503 `transient` + Retry-After), then the read or search, recorded.
"""
from __future__ import annotations

import dataclasses
import json
from types import MappingProxyType
from urllib.parse import quote_from_bytes

import orjson
import tornado.web
from tornado.httputil import HTTPInputError, parse_body_arguments

from audit.disclosures import Later, Recording, without_signature
from errors import ApiError
from fhir_api import FHIR_PATH_PREFIX
from fhir_api.admission import Admission, Ask, answer
from fhir_api.api import read, search, supported_type
from fhir_api.clinic_capability import clinic_capability_statement
from fhir_api.disclosure import describe_read, describe_search
from fhir_api.formats import check_format
from fhir_api.outcome import FHIR_JSON, FhirError, operation_outcome
from fhir_api.search import resource_id as valid_resource_id, search_arguments, strict_handling
from handlers.cors import CorsHandler
from models.ids import is_id

_ISSUE = MappingProxyType({400: "invalid", 401: "login", 403: "forbidden", 404: "not-found", 405: "not-supported",
                           406: "not-supported", 415: "not-supported", 413: "too-costly", 429: "throttled", 503: "transient",
                           504: "timeout"})
EXPOSED_HEADERS = "WWW-Authenticate, Retry-After, RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset"
QUERY_TEXT = "".join(map(chr, range(0x21, 0x7F)))
"""The bytes a query string carries as they are (printable ASCII): a POST `_search` form's other bytes
(a space, NUL and the other controls, non-ASCII, non-UTF-8) are recorded percent-encoded, as a GET's are."""


def fhir_json(value: dict) -> bytes:
    """`value` as compact UTF-8 JSON: orjson (a search page of 50 in about a tenth of `json`'s time,
    the same bytes for ASCII data); `json` for what orjson refuses (e.g. an integer past 64 bits)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":")).encode()


class FhirHandler(CorsHandler):
    """Base of the FHIR handlers: FHIR JSON out, OperationOutcome errors, the caller's CORS."""

    _limit_headers: dict = {}

    def set_default_headers(self):
        super().set_default_headers()
        if self.cors_origin:  # an app's browser code reads its limits too
            self.set_header("Access-Control-Expose-Headers", EXPOSED_HEADERS)

    def check_organization(self, organization_id: str) -> str:
        if not is_id(organization_id):
            raise FhirError(404, "not-found", "No such FHIR base.")
        return organization_id

    def search_args(self) -> dict:
        """The request's parameters, undecoded: the query's (a POST `_search` adds its form's)."""
        return self.request.query_arguments

    def accept_json(self) -> None:
        """406 unless the request admits JSON (`_format`, `Accept`)."""
        raw = self.search_args().get("_format")
        check_format(search_arguments({"_format": raw})["_format"] if raw else None, self.request.headers.get("Accept"))

    async def respond(self, organization_id: str, action: str, resource_type: str, path_id, checks, describe, fn, *args):
        """Write the answer of `fn(runtime, caller, *args)`: `fhir_api.admission.answer` in one pool
        job, whose outcome arrives once its record is committed (`Recording.run`), then what it
        admitted (CORS, limit headers), then its result or error."""
        self.check_organization(organization_id)
        self.accept_json()
        self.write_fhir(await self.answered(organization_id, action, resource_type, path_id, self.search_args(),
                                            checks, describe, fn, *args))

    async def answered(self, organization_id: str, action: str, resource_type: str, path_id, search_args: dict,
                       checks, describe, fn, *args, uses_ehr: bool = True, status: int = 200):
        """The result of `fn(runtime, caller, *args)` once admitted and recorded (or its error,
        raised), with what it admitted (CORS, limit headers) set on this response; `status`: the
        HTTP status this handler answers a success with (its disclosure record holds it)."""
        headers = self.request.headers
        ask = Ask(organization_id, headers.get("Authorization"), headers.get("Origin"), action, resource_type, path_id,
                  search_args, self.request_disclosure(action), uses_ehr=uses_ehr, status=status)
        admission, recording = Admission(), Recording(self.runtime)
        try:
            error, result = await recording.run(answer, self.runtime, ask, admission, recording, checks, describe, fn,
                                                *args)
            if isinstance(result, Later):  # the EHR's exchange, on this loop, then its record
                error, result = await recording.finish(result)
        except BaseException:
            recording.skip()
            raise
        finally:
            self.admitted(admission)
        if error is not None:
            raise error
        return result

    def admitted(self, admission: Admission) -> None:
        """What the job decided before the domain call, on this answer whatever it is."""
        if admission.cors_origin:
            self.cors_origin = admission.cors_origin
            self.set_default_headers()
        self._limit_headers = admission.limit_headers
        for name, value in self._limit_headers.items():
            self.set_header(name, value)
        if admission.refused_by:
            self.runtime.metrics.count_rate_limit_rejection(admission.refused_by)

    def write_fhir(self, value: dict) -> None:
        self.set_header("Content-Type", f"{FHIR_JSON}; charset=UTF-8")
        self.no_store()
        self.finish(fhir_json(value))

    def write_error(self, status_code: int, **kwargs):
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, FhirError):
            body = exc.body()
        elif isinstance(exc, ApiError):
            body = operation_outcome(_ISSUE.get(exc.status, "invalid"), exc.message)
        elif isinstance(exc, tornado.web.HTTPError) and status_code < 500:
            body = operation_outcome(_ISSUE.get(status_code, "invalid"), exc.log_message or self._reason)
        else:
            body = operation_outcome("exception", "The server could not complete the request.")
        # send_error() cleared our headers; an answer after the limiter keeps its RateLimit-* headers.
        for name, value in self._limit_headers.items():
            self.set_header(name, value)
        if isinstance(exc, ApiError):
            for name, value in exc.headers.items():
                self.set_header(name, value)
        self.write_fhir(body)


class MetadataHandler(FhirHandler):
    """`GET {iss}/metadata`: the CapabilityStatement; public (no token), any origin."""

    def set_default_headers(self):
        super().set_default_headers()
        self.set_header("Access-Control-Allow-Origin", "*")

    async def options(self, organization_id):
        self.set_header("Access-Control-Allow-Methods", "GET, OPTIONS")
        self.set_header("Access-Control-Allow-Headers", "Accept, Authorization")
        self.set_status(204)
        self.finish()

    async def get(self, organization_id):
        self.check_organization(organization_id)
        self.accept_json()
        self.write_fhir(await self.run(clinic_capability_statement, self.runtime, organization_id,
                                       self.runtime.clock.now().date().isoformat()))


class ReadHandler(FhirHandler):
    """`GET {iss}/{Type}/{id}`."""

    async def options(self, organization_id, resource_type, resource_id):
        await super().options()

    async def get(self, organization_id, resource_type, resource_id):
        await self.respond(organization_id, "read", resource_type, resource_id,
                          lambda: (supported_type(resource_type), valid_resource_id(resource_id)), describe_read,
                          read, resource_type, resource_id)


class SearchHandler(FhirHandler):
    """`GET {iss}/{Type}?params`: a searchset Bundle."""

    async def options(self, organization_id, resource_type):
        await super().options()

    async def get(self, organization_id, resource_type):
        strict = strict_handling(self.request.headers.get("Prefer"))
        raw = self.search_args()  # parsed on the pool: a 400 is recorded too
        await self.respond(organization_id, "search", resource_type, None, lambda: supported_type(resource_type),
                          describe_search,
                          lambda runtime, caller: search(runtime, caller, resource_type, search_arguments(raw), strict))


FORM = "application/x-www-form-urlencoded"
"""The media type of a POST `_search`'s parameters (FHIR R4 3.1.1.4)."""


class PostSearchHandler(SearchHandler):
    """`POST {iss}/{Type}/_search` (FHIR R4 3.1.1.4: `application/x-www-form-urlencoded`, its
    parameters those of the query and the form together): the same answer, limits and disclosure
    record as the GET, whose query string the record holds (the query's, then the form's)."""

    _args: dict | None = None

    def search_args(self) -> dict:
        """The query's parameters, then the form's. The form is parsed here, whatever the spelling
        of its media type (case-insensitive, RFC 9110 8.3.1; Tornado parses only the lower-case
        one, so another spelling's parameters would be dropped: a wider search than asked); a
        Content-Encoding is a 400, as Tornado answers it for the lower-case spelling."""
        if self._args is None:
            form: dict = {}
            try:
                parse_body_arguments(FORM, self.request.body or b"", form, {}, self.request.headers)
            except HTTPInputError as exc:
                raise FhirError(400, "invalid", f"Invalid body: {exc}") from None
            merged = {name: list(values) for name, values in self.request.query_arguments.items()}
            for name, values in form.items():
                merged.setdefault(name, []).extend(values)
            self._args = merged
        return self._args

    def request_disclosure(self, action: str, **fields):
        body = quote_from_bytes(self.request.body or b"", safe=QUERY_TEXT)  # no NUL: PostgreSQL text refuses it
        query = "&".join(part for part in (self.request.query, body) if part)
        return dataclasses.replace(super().request_disclosure(action, **fields), query=without_signature(query))

    async def get(self, organization_id, resource_type):
        raise FhirError(405, "not-supported", "Search with GET {iss}/{Type}?params; _search takes POST.")

    async def post(self, organization_id, resource_type):
        content_type = (self.request.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if content_type != FORM:
            raise FhirError(415, "not-supported", "A POST _search takes its parameters as "
                                                  "application/x-www-form-urlencoded.")
        await super().get(organization_id, resource_type)


class UnservedPathHandler(FhirHandler):
    """Any other path under the FHIR API (an operation or history not offered, a deeper path, a bare
    base): 404 `not-found` as an OperationOutcome, whatever the method; no token looked at, nothing
    recorded (the service's JSON 404 is not FHIR, and the API's errors all are)."""

    async def prepare(self):
        super().prepare()
        raise FhirError(404, "not-found", "Nothing is served at this path: a clinic's FHIR base {iss} serves "
                                          "metadata, {Type}/{id}, {Type}?params and Bulk Data's $export.")


def routes(runtime) -> list:
    base = rf"{FHIR_PATH_PREFIX}/([^/]+)"
    return [
        (rf"{base}/metadata", MetadataHandler),
        (rf"{base}/([^/]+)/_search", PostSearchHandler),
        (rf"{base}/([^/]+)/([^/]+)", ReadHandler),  # the type: `supported_type` (models.fhir_grammar)
        (rf"{base}/([^/]+)", SearchHandler),
        (rf"{FHIR_PATH_PREFIX}(?:/.*)?", UnservedPathHandler),  # last: after bulk's routes too (server.py)
    ]
