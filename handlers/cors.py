"""CORS for the endpoints an application's browser code calls (token, userinfo, introspect, revoke,
the FHIR API): the preflight answer and the response's `Access-Control-*` headers; the rule is oauth/cors.py."""
from __future__ import annotations

from handlers.base import BaseHandler
from oauth.cors import (ALLOWED_HEADERS, ALLOWED_METHODS, MAX_AGE_SECONDS, origin_allowed_for_client,
                        origin_registered, registered_origins)


class CorsHandler(BaseHandler):
    """An endpoint an application's browser code may call from an origin it registered
    (`apps create --allowed-origin`); see oauth/cors.py for the rule."""

    cors_origin: str | None = None

    def set_default_headers(self):
        super().set_default_headers()
        self.set_header("Vary", "Origin")
        if self.cors_origin:  # also after send_error's clear(): the error is readable too
            self.set_header("Access-Control-Allow-Origin", self.cors_origin)
            self.set_header("Access-Control-Expose-Headers", "WWW-Authenticate")

    async def options(self):
        origin = self.request.headers.get("Origin")
        if origin and origin_registered(await self.known_origins(), origin):
            self.set_header("Access-Control-Allow-Origin", origin)
            self.set_header("Access-Control-Allow-Methods", ALLOWED_METHODS)
            self.set_header("Access-Control-Allow-Headers", ALLOWED_HEADERS)
            self.set_header("Access-Control-Max-Age", str(MAX_AGE_SECONDS))
        self.set_status(204)
        self.finish()

    async def known_origins(self) -> frozenset[str]:
        """Every registered origin: from memory on the IOLoop, else read once in the pool."""
        applications = self.runtime.applications
        origins = applications.held_origins()
        if origins is None:
            origins = await self.run(applications.origins, registered_origins)
        return origins

    async def allow_origin_of(self, client_id: str | None) -> None:
        """Let the request's origin read this response when `client_id` registered it."""
        origin = self.request.headers.get("Origin")
        if origin and client_id and await self.run(origin_allowed_for_client, self.runtime.applications, client_id, origin):
            self.cors_origin = origin
            self.set_default_headers()
