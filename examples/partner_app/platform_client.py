"""The app backend's calls to the service: code exchange, userinfo, and the partner REST API."""
from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest


@dataclass
class Upstream:
    """One answer of the service: status and JSON body (None when unreachable)."""

    status: int
    body: dict | None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def client_error(self) -> bool:
        return 400 <= self.status < 500

    def describe(self) -> str:
        body = self.body or {}
        detail = body.get("error_description") or body.get("message") or ""
        return f"{self.status} {body.get('error', 'error')}" + (f": {detail}" if detail else "")


class PlatformClient:
    def __init__(self, config):
        self.config = config
        self.token_calls = 0  # how many times the token endpoint was called (tests read it)

    async def _call(self, method: str, url: str, body: dict | None = None, token: str | None = None) -> Upstream:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if token:
            headers["Authorization"] = f"Bearer {token}"
        request = HTTPRequest(url, method=method, headers=headers, request_timeout=15,
                              body=json.dumps(body) if body is not None else None)
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except (HTTPClientError, OSError) as exc:
            return Upstream(502, {"error": "service_unreachable", "message": str(exc)})
        try:
            payload = json.loads(response.body) if response.body else None
        except ValueError:
            payload = None
        return Upstream(response.code, payload if isinstance(payload, dict) else None)

    async def _token(self, body: dict) -> Upstream:
        self.token_calls += 1
        return await self._call("POST", f"{self.config.base_url}/oauth/token", body)

    async def exchange_code(self, code: str, code_verifier: str | None = None) -> Upstream:
        """Rotation step 2: current secret first; on a 4xx, once more with the fallback secret."""
        body = {"grant_type": "authorization_code", "client_id": self.config.client_id, "code": code}
        if code_verifier:
            body["code_verifier"] = code_verifier  # PKCE (RFC 7636)
        return await self._with_secrets(body)

    async def client_credentials(self) -> Upstream:
        body = {"grant_type": "client_credentials", "client_id": self.config.client_id}
        return await self._with_secrets(body)

    async def _with_secrets(self, body: dict) -> Upstream:
        """The current secret; on a 4xx, once more with the fallback (spec: client secret rotation).

        Both tries use the pair configured when the call started: promoting the fallback
        (`PartnerApp.use_secrets`) while a call is between its tries must not cost it the retry."""
        config = self.config
        answer = await self._token({**body, "client_secret": config.client_secret})
        if answer.client_error and config.fallback_secret:
            answer = await self._token({**body, "client_secret": config.fallback_secret})
        return answer

    async def userinfo(self, access_token: str) -> Upstream:
        return await self._call("GET", f"{self.config.base_url}/oauth/userinfo", token=access_token)

    async def set_activation_status(self, organization_id: str, status: str) -> Upstream:
        """PUT .../activation-status with a client-credentials token (the REST API)."""
        grant = await self.client_credentials()
        if not grant.ok:
            return grant
        url = (f"{self.config.base_url}/applications/{quote(self.config.application_id, safe='')}"
               f"/organizations/{quote(organization_id, safe='')}/activation-status")
        return await self._call("PUT", url, {"status": status}, token=grant.body["access_token"])
