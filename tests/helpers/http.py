"""HTTP clients of the tests: `Api` over pytest-tornado's client (every response checked against the
OpenAPI document), `LiveHttp` of a live process (keeps cookies), `http` (one urllib request, no
redirects followed), and a Basic `Authorization` value."""
from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request

from helpers.openapi import check_response  # every response is checked against /v1/openapi.json


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def http(method, url, body=None, headers=None):
    """One request with urllib, redirects not followed: (status, headers, body bytes)."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.build_opener(NoRedirect).open(request) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


class Api:
    """Small HTTP client over pytest-tornado's `http_client`: JSON in, (status, headers, body) out."""

    def __init__(self, http_client, base_url, runtime=None):
        self.http = http_client
        self.base_url = base_url
        self.runtime = runtime

    async def call(self, method, path, json_body=None, body=None, headers=None, follow_redirects=False):
        headers = dict(headers or {})
        if json_body is not None:
            body = json.dumps(json_body)
            headers.setdefault("Content-Type", "application/json")
        if method in ("POST", "PUT", "PATCH") and body is None:
            body = b""
        response = await self.http.fetch(self.base_url + path, method=method, body=body, headers=headers,
                                         raise_error=False, follow_redirects=follow_redirects)
        check_response(method, response.effective_url, response.code, response.headers, response.body)
        try:
            payload = json.loads(response.body) if response.body else None
        except ValueError:
            payload = response.body.decode("utf-8", "replace")
        return response.code, response.headers, payload


def basic_auth(client_id: str, secret: str) -> str:
    raw = f"{urllib.parse.quote(client_id)}:{urllib.parse.quote(secret)}".encode()
    return "Basic " + base64.b64encode(raw).decode()


class LiveHttp:
    """A small client of a live process (urllib): keeps cookies, never follows redirects; JSON in,
    (status, headers, body: parsed JSON or text) out. For processes of other releases too (the
    release fixtures), so it checks no OpenAPI contract."""

    def __init__(self, base: str):
        from http.cookiejar import CookieJar
        self.base = base
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()), NoRedirect)

    def call(self, method: str, path: str, json_body=None, form=None, headers=None, raw: bool = False):
        headers = dict(headers or {})
        data = None
        if json_body is not None:
            data, headers["Content-Type"] = json.dumps(json_body).encode(), "application/json"
        elif form is not None:
            data, headers["Content-Type"] = urllib.parse.urlencode(form).encode(), "application/x-www-form-urlencoded"
        request = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with self.opener.open(request, timeout=60) as response:
                status, head, body = response.status, response.headers, response.read()
        except urllib.error.HTTPError as exc:
            status, head, body = exc.code, exc.headers, exc.read()
        if raw:
            return status, head, body
        try:
            return status, head, json.loads(body)
        except ValueError:
            return status, head, body.decode("utf-8", "replace")
