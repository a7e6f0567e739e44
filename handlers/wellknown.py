"""Discovery at the issuer: JWKS and the OpenID Provider configuration."""
from __future__ import annotations

from handlers.base import BaseHandler
from oauth.discovery import openid_configuration


class JWKSHandler(BaseHandler):
    async def get(self):  # from the keyring in memory: no I/O
        self.set_header("Cache-Control", "public, max-age=300")
        self.write_json(self.runtime.keyring.jwks())


class OpenIDConfigurationHandler(BaseHandler):
    async def get(self):
        self.set_header("Cache-Control", "public, max-age=300")
        self.write_json(openid_configuration(self.svc_settings))


def routes(runtime) -> list:
    return [
        (r"/\.well-known/jwks\.json", JWKSHandler),
        (r"/\.well-known/openid-configuration", OpenIDConfigurationHandler),
    ]
