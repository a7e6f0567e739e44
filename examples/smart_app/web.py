"""Serving the example SMART app: its static pages under `/smart/` and its `config.json`."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import tornado.web

STATIC = Path(__file__).resolve().parent / "static"
PREFIX = "/smart/"


@dataclass(frozen=True)
class SmartAppConfig:
    """What the browser app is told: its client id and scope, and which users it lets in."""

    client_id: str
    scope: str
    authorized_users: tuple          # fhirUser references (absolute URLs) the app accepts
    platform_origins: tuple          # the service's origins: it frames the app and serves iss/token

    def as_json(self) -> dict:
        return {"clientId": self.client_id, "scope": self.scope, "authorizedUsers": list(self.authorized_users)}

    def content_security_policy(self) -> str:
        """Scripts and styles from here only; fetches to the service (SMART configuration, token,
        FHIR API); framed only by the service's hub."""
        platform = " ".join(self.platform_origins)
        return (f"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                f"connect-src 'self' {platform}; frame-ancestors {platform}; base-uri 'none'; "
                f"object-src 'none'; form-action 'self'")


class SmartStaticHandler(tornado.web.StaticFileHandler):
    """The app's files, with its CSP; pages are never cached (they run a one-time code)."""

    def set_extra_headers(self, path):
        config: SmartAppConfig = self.application.settings["smart"]
        self.set_header("Content-Security-Policy", config.content_security_policy())
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Referrer-Policy", "no-referrer")
        if path.endswith(".html"):
            self.set_header("Cache-Control", "no-store")


class SmartConfigHandler(tornado.web.RequestHandler):
    async def get(self):
        config: SmartAppConfig = self.application.settings["smart"]
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Content-Type-Options", "nosniff")
        self.finish(json.dumps(config.as_json()))


def make_smart_app(config: SmartAppConfig) -> tornado.web.Application:
    return tornado.web.Application([
        (PREFIX + "config.json", SmartConfigHandler),
        (PREFIX + "(.*)", SmartStaticHandler, {"path": str(STATIC), "default_filename": "index.html"}),
    ], smart=config)
