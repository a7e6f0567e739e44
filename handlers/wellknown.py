"""Discovery at the issuer: JWKS, the OpenID Provider configuration and RFC 8414 metadata, the
JWKS of svc-auth's client keys for EHRs (`/ehr/jwks.json`), and each clinic FHIR base's SMART
configuration (`{iss}/.well-known/smart-configuration`)."""
from __future__ import annotations

import re

from fhir_api import FHIR_PATH_PREFIX
from handlers.base import BaseHandler
from errors import ApiError
from lifecycle.organizations import find_organization
from models.ids import is_id
from oauth.discovery import openid_configuration
from oauth.smart_configuration import smart_configuration


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


class SmartConfigurationHandler(PublicMetadataHandler):
    """SMART App Launch discovery of one clinic's FHIR base; an unknown clinic is 404."""

    async def get(self, organization_id):
        if not is_id(organization_id):  # junk (NUL, encodings) is never looked up
            raise ApiError(404, "organization_not_found", "No organization has this id.")
        await self.run(find_organization, organization_id)
        self.set_header("Cache-Control", "public, max-age=300")
        self.write_json(smart_configuration(self.svc_settings))


def routes(runtime) -> list:
    return [
        (r"/\.well-known/jwks\.json", JWKSHandler),
        (r"/ehr/jwks\.json", EhrJWKSHandler),
        (r"/\.well-known/openid-configuration", OpenIDConfigurationHandler),
        (r"/\.well-known/oauth-authorization-server", OpenIDConfigurationHandler),  # RFC 8414: same document
        (re.escape(FHIR_PATH_PREFIX) + r"/([^/]+)/\.well-known/smart-configuration", SmartConfigurationHandler),
    ]
