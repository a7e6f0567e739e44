"""The platform FHIR R4 API for apps (`/fhir/r4/{svcOrganizationId}`): metadata, read and search.

Thin: `fhir_api` decides. Every answer is `application/fhir+json`, errors OperationOutcomes.
CORS: metadata answers any origin; read and search answer the calling application's registered
origins (`oauth/cors.py`), preflight included.
"""
from __future__ import annotations

import json
from types import MappingProxyType

import tornado.web

from errors import ApiError
from fhir_api import FHIR_PATH_PREFIX
from fhir_api.access import authenticate
from fhir_api.api import read, search
from fhir_api.capability import capability_statement
from fhir_api.formats import check_format
from fhir_api.outcome import FHIR_JSON, FhirError, operation_outcome
from fhir_api.search import RESOURCE_ID, search_arguments
from handlers.oauth import CorsHandler

_ISSUE = MappingProxyType({400: "invalid", 401: "login", 403: "forbidden", 404: "not-found", 405: "not-supported",
                           406: "not-supported", 413: "too-costly", 429: "throttled", 503: "transient",
                           504: "timeout"})


class FhirHandler(CorsHandler):
    """Base of the FHIR handlers: FHIR JSON out, OperationOutcome errors, the caller's CORS."""

    def initialize(self, variant=None):
        super().initialize(variant)

    def check_organization(self, organization_id: str) -> str:
        if not RESOURCE_ID.match(organization_id or ""):
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
        return caller

    def write_fhir(self, value: dict) -> None:
        self.set_header("Content-Type", f"{FHIR_JSON}; charset=UTF-8")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(value, separators=(",", ":")))

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
        self.write_fhir(await self.run(read, self.runtime, caller, resource_type, resource_id))


class SearchHandler(FhirHandler):
    """`GET {iss}/{Type}?params`: a searchset Bundle."""

    async def options(self, organization_id, resource_type):
        await super().options()

    async def get(self, organization_id, resource_type):
        caller = await self.caller(organization_id)
        args = search_arguments(self.request.query_arguments)
        self.write_fhir(await self.run(search, self.runtime, caller, resource_type, args))


def routes(runtime) -> list:
    base = rf"{FHIR_PATH_PREFIX}/([^/]+)"
    return [
        (rf"{base}/metadata", MetadataHandler),
        (rf"{base}/([A-Z][A-Za-z]+)/([^/]+)", ReadHandler),
        (rf"{base}/([A-Z][A-Za-z]+)", SearchHandler),
    ]
