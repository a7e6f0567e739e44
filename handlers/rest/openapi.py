"""`GET /v1/openapi.json` (the OpenAPI 3.1 document of the REST API and the OAuth endpoints),
`GET /v1/schemas/chart.json` (the JSON Schema of a chart ZIP's JSON) and `GET /v1/docs`, the same document as browsable documentation: Swagger UI, vendored under
static/docs/swagger-ui/ (npm `swagger-ui-dist`, `make vendor-swagger-ui`), no CDN.
"""
from __future__ import annotations

import tornado.escape

from handlers.base import BaseHandler
from partner_api.openapi import openapi_document
from workers.chart_schema import CHART_SCHEMA_JSON

# Only this origin: the page loads the vendored assets and the document, and sends nothing
# elsewhere. Swagger UI styles some elements inline; it needs no inline script.
DOCS_CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
            "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


class OpenApiHandler(BaseHandler):
    async def get(self):
        self.set_header("Access-Control-Allow-Origin", "*")
        self.write_json(openapi_document(self.svc_settings.public_url))


class ChartSchemaHandler(BaseHandler):
    """`GET /v1/schemas/chart.json`: the chart JSON's schema (no token; the same for a day)."""

    async def get(self):
        self.set_header("Access-Control-Allow-Origin", "*")
        self.set_header("Content-Type", "application/schema+json")
        self.set_header("Cache-Control", "public, max-age=86400")
        self.finish(CHART_SCHEMA_JSON)


class DocsHandler(BaseHandler):
    async def get(self):
        self.html_headers(DOCS_CSP)
        def asset(path: str) -> str:
            return tornado.escape.xhtml_escape(self.static_url(path))
        self.finish(f"""<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>svc-auth API reference</title>
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <link rel="icon" type="image/png" href="{asset("docs/swagger-ui/favicon-32x32.png")}">
  <link rel="stylesheet" href="{asset("docs/swagger-ui/swagger-ui.css")}">
  <script src="{asset("docs/swagger-ui/swagger-ui-bundle.js")}" defer></script>
  <script src="{asset("docs/docs.js")}" defer></script>
</head>
<body>
  <noscript>This page needs JavaScript; the document itself is <a href="/v1/openapi.json">/v1/openapi.json</a>.</noscript>
  <div id="swagger-ui" data-spec-url="/v1/openapi.json"></div>
</body>
</html>
""")


def routes(runtime) -> list:
    return [(r"/v1/openapi.json", OpenApiHandler), (r"/v1/docs", DocsHandler),
            (r"/v1/schemas/chart.json", ChartSchemaHandler)]
