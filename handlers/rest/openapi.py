"""`GET /v1/openapi.json`: the OpenAPI 3.1 document of the REST API and the OAuth endpoints."""
from __future__ import annotations

from handlers.base import BaseHandler
from partner_api.openapi import openapi_document


class OpenApiHandler(BaseHandler):
    async def get(self):
        self.set_header("Access-Control-Allow-Origin", "*")
        self.write_json(openapi_document(self.svc_settings.public_url))


def routes(runtime) -> list:
    return [(r"/v1/openapi.json", OpenApiHandler)]
