"""The platform FHIR R4 API for apps (`/fhir/r4/{svcOrganizationId}`): metadata, read and search.

Thin: `fhir_api` decides. Every answer is `application/fhir+json`, errors OperationOutcomes.
CORS: metadata answers any origin; read and search answer the calling application's registered
origins (`oauth/cors.py`), preflight included.

Limits (docs/fhir-api.md): after authentication, one `hit_all` of the rate limiter per request
(per app and clinic, per token: `fhir_api.limits`; 429 `throttled` + Retry-After, `RateLimit-*`
headers on every answer after it); then a slot of the clinic's EHR in this process
(`runtime.ehr_concurrency`; none free: 503 `transient` + Retry-After) while the read or search runs.
"""
from __future__ import annotations

import json
from types import MappingProxyType

import orjson
import tornado.web

from audit.disclosures import disclosed
from errors import ApiError
from fhir_api import FHIR_PATH_PREFIX
from fhir_api.access import authenticate
from fhir_api.api import read, search, supported_type
from fhir_api.capability import capability_statement
from fhir_api.disclosure import describe_read, describe_search, fhir_disclosure
from fhir_api.formats import check_format
from fhir_api.limits import counters, refusal_message
from fhir_api.outcome import FHIR_JSON, FhirError, operation_outcome
from fhir_api.search import resource_id as valid_resource_id, search_arguments, strict_handling
from handlers.cors import CorsHandler
from ratelimit import RateLimiterUnavailable
from models.ids import is_id

_ISSUE = MappingProxyType({400: "invalid", 401: "login", 403: "forbidden", 404: "not-found", 405: "not-supported",
                           406: "not-supported", 413: "too-costly", 429: "throttled", 503: "transient",
                           504: "timeout"})
LIMITER_RETRY_AFTER = 5   # seconds: the rate limiter's store (Redis) is unreachable
EHR_BUSY_RETRY_AFTER = 2  # seconds: every slot of the clinic's EHR is in use in this process
EXPOSED_HEADERS = "WWW-Authenticate, Retry-After, RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset"


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

    def accept_json(self) -> None:
        """406 unless the request admits JSON (`_format`, `Accept`)."""
        raw = self.request.query_arguments.get("_format")
        check_format(search_arguments({"_format": raw})["_format"] if raw else None, self.request.headers.get("Accept"))

    async def caller(self, organization_id: str):
        self.check_organization(organization_id)
        self.accept_json()
        caller = await self.run(authenticate, self.runtime, self.request.headers.get("Authorization"), organization_id)
        await self.allow_origin_of(caller.claims.get("client_id"))
        await self.apply_limits(caller)
        return caller

    async def apply_limits(self, caller) -> None:
        """Count the request against the caller's limits (one limiter call): 429 when over one."""
        limits = counters(self.svc_settings, caller)
        try:
            decision = await self.runtime.rate_limiter.hit_all(limits)
        except RateLimiterUnavailable:
            raise FhirError(503, "transient", "The rate limiter's store cannot be reached; the request was not "
                                              "processed. Retry shortly.",
                            {"Retry-After": str(LIMITER_RETRY_AFTER)}) from None
        self._limit_headers = decision.headers()
        for name, value in self._limit_headers.items():
            self.set_header(name, value)
        if not decision.allowed:
            self.runtime.metrics.count_rate_limit_rejection(decision.key.split(":", 1)[0])
            raise FhirError(429, "throttled", refusal_message(decision, dict(limits)[decision.key].seconds),
                            self._limit_headers)

    def disclosure(self, caller, action: str, resource_type: str, path_id: str | None = None):
        """The disclosure audit's view of this request (audit/; what it asked: fhir_api/disclosure.py)."""
        return fhir_disclosure(caller, action, resource_type, path_id, self.request.query_arguments,
                               self.request_disclosure(action))

    async def through_ehr(self, disclosure, describe, fn, caller, *args):
        """`fn(runtime, caller, *args)` on the pool, holding one of the clinic's EHR slots of this
        process (none free: 503 at once, the EHR's protection, not the caller's fault); its
        disclosure is recorded (success or failure) before we answer (`audit.disclosures.disclosed`)."""
        cap, clinic = self.runtime.ehr_concurrency, caller.organization_id
        if not cap.try_acquire(clinic):
            raise FhirError(503, "transient", "Too many requests to this clinic's EHR are in progress; "
                                              f"retry after {EHR_BUSY_RETRY_AFTER} seconds.",
                            {"Retry-After": str(EHR_BUSY_RETRY_AFTER)})
        try:
            return await disclosed(self.runtime, disclosure, describe, 200, fn, self.runtime, caller, *args)
        finally:
            cap.release(clinic)

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
        self.write_fhir(capability_statement(self.svc_settings, organization_id,
                                             self.runtime.clock.now().date().isoformat()))


class ReadHandler(FhirHandler):
    """`GET {iss}/{Type}/{id}`."""

    async def options(self, organization_id, resource_type, resource_id):
        await super().options()

    async def get(self, organization_id, resource_type, resource_id):
        caller = await self.caller(organization_id)
        supported_type(resource_type)  # 404 / 400 before the disclosure record holds them
        valid_resource_id(resource_id)
        self.write_fhir(await self.through_ehr(self.disclosure(caller, "read", resource_type, resource_id), describe_read,
                                               read, caller, resource_type, resource_id))


class SearchHandler(FhirHandler):
    """`GET {iss}/{Type}?params`: a searchset Bundle."""

    async def options(self, organization_id, resource_type):
        await super().options()

    async def get(self, organization_id, resource_type):
        caller = await self.caller(organization_id)
        supported_type(resource_type)  # 404 before the disclosure record holds it
        strict = strict_handling(self.request.headers.get("Prefer"))
        self.write_fhir(await self.through_ehr(  # the arguments are parsed on the pool: a 400 is recorded too
            self.disclosure(caller, "search", resource_type), describe_search,
            lambda runtime, caller, raw: search(runtime, caller, resource_type, search_arguments(raw), strict),
            caller, self.request.query_arguments))


def routes(runtime) -> list:
    base = rf"{FHIR_PATH_PREFIX}/([^/]+)"
    return [
        (rf"{base}/metadata", MetadataHandler),
        (rf"{base}/([^/]+)/([^/]+)", ReadHandler),  # the type: `supported_type` (models.fhir_grammar)
        (rf"{base}/([^/]+)", SearchHandler),
    ]
