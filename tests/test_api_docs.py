"""The OpenAPI document is codegen-ready, and `/v1/docs` browses it from local assets only."""
from __future__ import annotations

import json
import re

import pytest

from helpers.environment import ROOT
from partner_api.openapi import openapi_document

SWAGGER_UI = ROOT / "static" / "docs" / "swagger-ui"


def operations(doc: dict):
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            yield path, method, operation


def test_every_operation_has_a_unique_operation_id():
    doc = openapi_document("https://auth.example")
    ids = [op.get("operationId") for _, _, op in operations(doc)]
    assert None not in ids, [f"{m.upper()} {p}" for p, m, op in operations(doc) if "operationId" not in op]
    assert len(ids) == len(set(ids)) and len(ids) >= 25
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", i) for i in ids), ids


def test_partner_operations_use_oauth2_client_credentials_at_the_token_operation():
    doc = openapi_document("https://auth.example")
    scheme = doc["components"]["securitySchemes"]["partnerToken"]
    assert scheme["type"] == "oauth2"
    assert scheme["flows"]["clientCredentials"]["tokenUrl"] == "https://auth.example/v1/oauth/token"
    assert doc["paths"]["/v1/oauth/token"]["post"]["operationId"] == "oauth_token"
    partner = [op for path, _, op in operations(doc) if path.startswith(("/v1/applications", "/v1/appointments",
                                                                         "/v1/chart-retrieval", "/v1/invitations"))]
    assert len(partner) == 9 and all(op["security"] == [{"partnerToken": []}] for op in partner)


def test_the_token_body_has_one_schema_per_content_type():
    doc = openapi_document("https://auth.example")
    for prefix in ("/v1", "/os-api/v2"):
        content = doc["paths"][f"{prefix}/oauth/token"]["post"]["requestBody"]["content"]
        assert content["application/json"]["schema"] == {"$ref": "#/components/schemas/TokenRequestJson"}
        assert content["application/x-www-form-urlencoded"]["schema"] == {
            "$ref": "#/components/schemas/TokenRequestForm"}


@pytest.mark.gen_test
async def test_docs_page_loads_swagger_ui_from_this_service_only(api):
    status, headers, page = await api.call("GET", "/v1/docs")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    csp = headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp and "default-src 'none'" in csp
    assert 'data-spec-url="/v1/openapi.json"' in page
    # No CDN: every script, stylesheet and icon is a path on this service, and each one loads.
    urls = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert len([u for u in urls if u.startswith("/static/")]) == 4
    assert all(u.startswith("/") for u in urls), urls
    for url in urls:
        status, headers, body = await api.call("GET", url.replace("&amp;", "&"))
        assert status == 200, url
    status, headers, body = await api.call("GET", "/static/docs/swagger-ui/swagger-ui-bundle.js")
    assert "javascript" in headers["Content-Type"] and "SwaggerUIBundle" in body


def test_vendored_swagger_ui_keeps_its_licence_and_version():
    package = json.loads((SWAGGER_UI / "package.json").read_text())
    assert package["name"] == "swagger-ui-dist" and package["license"] == "Apache-2.0"
    assert "Apache License" in (SWAGGER_UI / "LICENSE").read_text()
    assert (SWAGGER_UI / "swagger-ui-bundle.js.LICENSE.txt").is_file() and (SWAGGER_UI / "NOTICE").is_file()
    makefile = (ROOT / "Makefile").read_text()
    assert f"SWAGGER_UI_VERSION := {package['version']}\n" in makefile  # `make vendor-swagger-ui` reproduces it
