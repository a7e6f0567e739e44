"""`PartnerApiHandler`: the one place a REST call is admitted.

In order: the client network against the global allowlist, the Bearer client-credentials token
(401 + `WWW-Authenticate`), the application's own allowlist, the rate limit of the operation for
that client (`RateLimit-*` headers on every limited response, a refused one included, 429 +
`Retry-After` when exceeded, 503 when the shared limiter cannot be reached), then every path
parameter against the id grammar (400 `invalid_path_parameter`, before any lookup or disclosure
record holds it; the limiter is keyed by the client and operation, never by a path value).
"""
from __future__ import annotations

from audit.disclosures import disclosed
from handlers.base import BaseHandler
from errors import ApiError
from models.ids import is_id
from partner_api.access import path_id
from partner_api.auth import partner_caller
from partner_api.network import parse_networks, require_allowed_network
from ratelimit import RateLimiterUnavailable


class PartnerApiHandler(BaseHandler):
    operations: dict[str, str] = {}
    """HTTP method -> rate-limit operation name (see `ratelimit.policy`)."""

    partner_app = None
    partner_claims: dict = {}
    _limit_headers: dict = {}

    path_names: tuple[str, ...] = ()
    """The names (as in the OpenAPI document) of the route's path parameters, all ids."""

    async def prepare(self):
        super().prepare()
        self.no_store()
        address = self.client_address()
        require_allowed_network(address, self.svc_settings.rest_allowed_networks)
        self.partner_app, self.partner_claims = await self.run(partner_caller, self.runtime,
                                                               self.request.headers.get("Authorization"))
        require_allowed_network(address, parse_networks(self.partner_app.rest_allowed_networks))
        operation = self.operations.get(self.request.method)
        if operation:
            await self.apply_rate_limit(operation)
        for index, value in enumerate(self.path_args):  # before any lookup or audit record holds them
            path_id(self.path_names[index] if index < len(self.path_names) else "path parameter", value)

    async def apply_rate_limit(self, operation: str) -> None:
        try:
            decision = await self.runtime.rate_limiter.hit(self.partner_app.id, operation)
        except RateLimiterUnavailable:
            raise ApiError(503, "rate_limiter_unavailable",
                           "The rate limiter's store (Redis) cannot be reached; the request was not processed. "
                           "Retry shortly.", {"Retry-After": "5"}) from None
        self._limit_headers = decision.headers()
        for name, value in self._limit_headers.items():
            self.set_header(name, value)
        if not decision.allowed:
            self.runtime.metrics.count_rate_limit_rejection(operation)
            raise ApiError(429, "rate_limited",
                           f"Too many requests for this operation: the limit is {decision.limit} per "
                           f"{self.runtime.rate_limiter.limit_of(operation).seconds} seconds. "
                           f"Retry after {decision.reset} seconds.", self._limit_headers)

    def write_error(self, status_code: int, **kwargs):
        # send_error() cleared our headers; a limited response keeps its RateLimit-* headers.
        for name, value in self._limit_headers.items():
            self.set_header(name, value)
        super().write_error(status_code, **kwargs)

    async def disclose(self, action: str, organization_id, describe, status: int, fn, *args, **asked):
        """`fn(*args)` on the pool, its disclosure recorded (audit/) before we answer. Client
        credentials: no user; `asked`: the resource type, ids and patients a failure names."""
        app = self.partner_app
        disclosure = self.request_disclosure(
            action, organization_id=organization_id if is_id(organization_id) else None,  # a body's: any text
            application_id=app.id, client_id=app.client_id, jti=self.partner_claims.get("jti"),
            scope=self.partner_claims.get("scope"), **asked)
        return await disclosed(self.runtime, disclosure, describe, status, fn, *args)

    def json_body(self) -> dict:
        """The body as a JSON object (the REST API takes JSON only)."""
        return self.body_params(allow_form=False)
