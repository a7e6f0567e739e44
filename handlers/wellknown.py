"""Discovery at the issuer: JWKS, the OpenID Provider configuration and RFC 8414 metadata, and the
JWKS of svc-auth's client keys for EHRs (`/ehr/jwks.json`)."""
from __future__ import annotations

from handlers.base import BaseHandler
from oauth.discovery import openid_configuration


class PublicMetadataHandler(BaseHandler):
    """Public documents any origin may read (browser-based clients fetch them): GET only."""

    def set_default_headers(self):
        super().set_default_headers()
        if self.request.method in ("GET", "HEAD"):
            self.set_header("Access-Control-Allow-Origin", "*")


class JWKSHandler(PublicMetadataHandler):
    async def get(self):  # from the keyring in memory: no I/O
        self.set_header("Cache-Control", f"public, max-age={self.svc_settings.jwks_max_age}")
        self.write_json(self.runtime.keyring.jwks())


class EhrJWKSHandler(PublicMetadataHandler):
    """svc-auth's client keys for EHRs (SMART Backend Services): the `jwks_uri` an EHR is given."""

    async def get(self):
        self.set_header("Cache-Control", "public, max-age=300")
        self.write_json(await self.run(self.runtime.ehr_keys.jwks))


class OpenIDConfigurationHandler(PublicMetadataHandler):
    async def get(self):
        self.set_header("Cache-Control", "public, max-age=300")
        self.write_json(openid_configuration(self.svc_settings))


def routes(runtime) -> list:
    return [
        (r"/\.well-known/jwks\.json", JWKSHandler),
        (r"/ehr/jwks\.json", EhrJWKSHandler),
        (r"/\.well-known/openid-configuration", OpenIDConfigurationHandler),
        (r"/\.well-known/oauth-authorization-server", OpenIDConfigurationHandler),  # RFC 8414: same document
    ]
