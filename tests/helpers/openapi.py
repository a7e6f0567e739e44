"""Keeps `GET /v1/openapi.json` true: every response the test suite sees is checked against it.

`helpers.http.Api.call` passes each response here. A documented path must answer only
documented statuses, with the documented required headers and a JSON body valid against the
documented schema. Paths the document does not cover (well-known, sandbox pages) are skipped.
"""
from __future__ import annotations

import functools
import json
import re
from urllib.parse import urlsplit

import jsonschema
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from partner_api.openapi import openapi_document

SEEN: list[tuple[str, str, int]] = []
"""(method, path template, status) of every validated response, for coverage tests."""


@functools.lru_cache(maxsize=1)
def _spec():
    doc = openapi_document("http://127.0.0.1")
    registry = Registry().with_resource("urn:svc-auth:openapi", Resource(doc, specification=DRAFT202012))
    templates = []
    for template, item in doc["paths"].items():
        pattern = "^" + re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)) + "$"
        templates.append((re.compile(pattern), template, item))
    # Literal paths first, so /v1/openapi.json is not taken for a template.
    templates.sort(key=lambda t: t[1].count("{"))
    return doc, registry, templates


def operation_for(method: str, path: str):
    _, _, templates = _spec()
    for pattern, template, item in templates:
        if pattern.match(path):
            return template, item.get(method.lower())
    return None, None


def check_response(method: str, url: str, status: int, headers, body: bytes) -> None:
    """AssertionError when the response contradicts the OpenAPI document."""
    if method == "OPTIONS":
        return  # a CORS preflight is transport, not an API operation (OpenAPI does not describe it)
    path = urlsplit(url).path
    template, operation = operation_for(method, path)
    if template is None:
        return
    assert operation is not None, f"{method} {path} answered {status} but {template} documents no {method}"
    if status == 405:
        return
    responses = operation["responses"]
    spec = responses.get(str(status))
    assert spec is not None, f"{method} {template} answered undocumented status {status}: {body[:300]!r}"
    for name, header in spec.get("headers", {}).items():
        if header.get("required"):
            assert headers.get(name) is not None, f"{method} {template} {status} lacks required header {name}"
    content = spec.get("content")
    if not content:
        return
    content_type = (headers.get("Content-Type") or "").split(";")[0].strip()
    assert content_type in content, f"{method} {template} {status}: Content-Type {content_type!r} not documented"
    if content_type != "application/json":
        return
    doc, registry, _ = _spec()
    schema = {"$ref": "urn:svc-auth:openapi#/paths/" + template.replace("~", "~0").replace("/", "~1")
              + f"/{method.lower()}/responses/{status}/content/application~1json/schema"}
    validator = jsonschema.Draft202012Validator(schema, registry=registry,
                                                format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    errors = sorted(validator.iter_errors(json.loads(body)), key=lambda e: list(e.path))
    assert not errors, f"{method} {template} {status} body violates the OpenAPI document: {errors[0].message}"
    SEEN.append((method.upper(), template, status))
