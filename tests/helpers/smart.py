"""SMART apps in tests: a launch against a live `svc-auth serve` as an app does it (`launch_tokens`), and
an app's side of refresh tokens over real HTTP (`SmartClient`, the `api` fixture's server): the EHR
launch as the SMART certification kit runs it, then refresh, revoke, introspect and a FHIR read."""
from __future__ import annotations

import json
import urllib.parse

from connectors.sandbox import patient_panel
from helpers.http import basic_auth, http
from helpers.tokens import as_service
from oauth.pkce import s256

KIT_SCOPE = "launch openid fhirUser offline_access patient/*.read"
"""What the SMART App Launch STU 2.2 test kit (and both gallery apps) ask for in an EHR launch."""
VERIFIER = "refresh-" + "v" * 40 + "-._~0123456789"


def iss_of(org_id: str) -> str:
    return f"http://127.0.0.1:8888/fhir/r4/{org_id}"


class SmartClient:
    """One SMART app (`app`; `secret` None for a public client) launched by `sandbox_token`'s user."""

    def __init__(self, api, app, secret: str | None, sandbox_token: str, org_id: str, prefix: str = "/v1"):
        self.api, self.app, self.secret, self.sandbox_token, self.org_id = api, app, secret, sandbox_token, org_id
        self.prefix = prefix
        self.patient = patient_panel(org_id)[0].id  # a patient of the clinic's sandbox EHR

    async def launch(self, sandbox_token: str | None = None) -> str:
        """A launch in the hub with `self.patient` in context."""
        body = {"client_id": self.app.client_id, "patient_id": self.patient}
        status, _, answer = await self.api.call("POST", "/v1/sandbox/launches", body, headers={
            "Authorization": f"Bearer {sandbox_token or self.sandbox_token}"})
        assert status == 201, answer
        return answer["launch_id"]

    async def authorize(self, scope: str = KIT_SCOPE, pkce: bool = True, launch_param: str = "launch",
                        launch_id: str | None = None) -> dict:
        """The authorization response's query (code or error), as the kit's EHR launch sends it."""
        query = {"response_type": "code", "client_id": self.app.client_id, "redirect_uri": self.app.redirect_uri,
                 launch_param: launch_id or await self.launch(), "scope": scope, "state": "kit-state",
                 "aud": iss_of(self.org_id)}
        if pkce:
            query.update(code_challenge=s256(VERIFIER), code_challenge_method="S256")
        status, headers, body = await self.api.call(
            "GET", f"{self.prefix}/oauth/authorize?{urllib.parse.urlencode(query)}")
        assert status == 302, body
        return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(headers["Location"]).query))

    async def token(self, form: dict) -> tuple[int, dict]:
        """POST the token endpoint as the app does: form-encoded; Basic for a confidential client,
        `client_id` in the body for a public one."""
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        if self.secret is None:
            form = {"client_id": self.app.client_id, **form}
        else:
            headers["Authorization"] = basic_auth(self.app.client_id, self.secret)
        status, _, body = await self.api.call("POST", f"{self.prefix}/oauth/token",
                                              body=urllib.parse.urlencode(form), headers=headers)
        return status, body

    async def tokens(self, scope: str = KIT_SCOPE, **authorize) -> dict:
        """A whole launch: launch, authorize, code exchange (with the PKCE verifier)."""
        answer = await self.authorize(scope, **authorize)
        assert "code" in answer, answer
        status, body = await self.token({"grant_type": "authorization_code", "code": answer["code"],
                                         "redirect_uri": self.app.redirect_uri, "code_verifier": VERIFIER})
        assert status == 200, body
        return body

    async def refresh(self, refresh_token: str, scope: str | None = None) -> tuple[int, dict]:
        form = {"grant_type": "refresh_token", "refresh_token": refresh_token}
        if scope is not None:
            form["scope"] = scope
        return await self.token(form)

    async def revoke(self, token: str) -> int:
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        form = {"token": token}
        if self.secret is None:
            form["client_id"] = self.app.client_id
        else:
            headers["Authorization"] = basic_auth(self.app.client_id, self.secret)
        status, _, _ = await self.api.call("POST", f"{self.prefix}/oauth/revoke", body=urllib.parse.urlencode(form),
                                           headers=headers)
        return status

    async def introspect(self, token: str, secret: str) -> dict:
        """RFC 7662 by a confidential client (introspection takes no public client)."""
        status, _, body = await self.api.call(
            "POST", f"{self.prefix}/oauth/introspect", body=urllib.parse.urlencode({"token": token}),
            headers={"Authorization": basic_auth(self.app.client_id, secret),
                     "Content-Type": "application/x-www-form-urlencoded"})
        assert status == 200, body
        return body

    async def read_patient(self, access_token: str) -> tuple[int, dict]:
        status, _, body = await self.api.call("GET", f"/fhir/r4/{self.org_id}/Patient/{self.patient}",
                                              headers={"Authorization": f"Bearer {access_token}",
                                                       "Accept": "application/fhir+json"})
        return status, body


def launch_tokens(live: str, runtime, user, app, secret: str, scope: str, prefix: str = "/v1") -> dict:
    """The token response of a launch by `user` (signed in to the sandbox hub) of `app`, asking `scope`
    at the authorize and token endpoints under `prefix` (`/v1` or `/os-api/v2`)."""
    from hub.sandbox import issue_sandbox_token
    as_live = as_service(runtime, live)
    status, _, body = http("POST", f"{live}/v1/sandbox/launches", json.dumps({"client_id": app.client_id}).encode(),
                           {"Authorization": f"Bearer {issue_sandbox_token(as_live, user)}",
                            "Content-Type": "application/json"})
    assert status == 201, body
    query = {"client_id": app.client_id, "redirect_uri": app.redirect_uri, "response_type": "code",
             "launch": json.loads(body)["launch_id"], "scope": scope}
    status, headers, body = http("GET", f"{live}{prefix}/oauth/authorize?{urllib.parse.urlencode(query)}")
    assert status == 302, body
    location = urllib.parse.parse_qs(urllib.parse.urlsplit(headers["Location"]).query)
    assert "code" in location, location
    status, _, body = http("POST", f"{live}{prefix}/oauth/token", json.dumps({
        "grant_type": "authorization_code", "client_id": app.client_id, "client_secret": secret,
        "code": location["code"][0]}).encode(), {"Content-Type": "application/json"})
    assert status == 200, body
    return json.loads(body)
