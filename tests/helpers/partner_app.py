"""The example partner app on a real port (`Partner`; the `partner` fixture, conftest.py's, makes
them), and traffic through it. Modules using `partner` mark themselves with `PARTNER_SETTINGS` (the
issuer is the real port: the app fetches its JWKS).
"""
from __future__ import annotations

import asyncio
import json
import urllib.parse

import pytest
import tornado.httpserver

from examples.partner_app.config import PartnerConfig
from examples.partner_app.web import make_partner_app
from helpers.processes import free_port
from hub.launches import create_launch
from hub.sandbox import issue_sandbox_token
from lifecycle.applications import install_application, register_application


PARTNER_SETTINGS = pytest.mark.svc_settings(own_keys=True, real_issuer=True)
"""Keys are per test (one test rotates them); the issuer is the service's real address."""


class Partner:
    """An example partner app registered with the service, served on its own port."""

    def __init__(self, runtime, world, io_loop, **overrides):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.runtime, self.world = runtime, world
        self.app, self.secret = register_application(
            runtime, "Example Partner App", f"{self.url}/app", f"{self.url}/launch", f"{self.url}/api/token",
            "free_trial", ["email", "name", "ehrUsername", "organization"], [runtime.settings.public_url])
        install_application(self.app.id, world.org.id)
        fields = dict(auth_url=runtime.settings.issuer, base_url=runtime.settings.public_url + "/v1",
                      client_id=self.app.client_id, client_secret=self.secret, application_id=self.app.id,
                      public_url=self.url, authorized_users={world.physician.id}, jwks_min_refresh_seconds=0)
        fields.update(overrides)
        self.config = PartnerConfig(**fields)
        web = make_partner_app(self.config)
        self.state = web.settings["partner"]
        self.server = tornado.httpserver.HTTPServer(web)
        self.server.listen(self.port, address="127.0.0.1")

    def launch_query(self, user) -> dict:
        launch, url = create_launch(self.runtime, user, self.app.client_id)
        return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))


async def fetch(api, url, method="GET", body=None, headers=None):
    """`api.call` for absolute URLs (the example app is on another port)."""
    client = api.http
    response = await client.fetch(url, method=method, headers=headers or {}, raise_error=False,
                                  follow_redirects=False,
                                  body=(json.dumps(body) if isinstance(body, dict) else body) if method != "GET" else None)
    try:
        payload = json.loads(response.body) if response.body else None
    except ValueError:
        payload = response.body.decode()
    return response.code, response.headers, payload


class LaunchTraffic:
    """Launches one after another until stopped; records each outcome with the rotation phase."""

    def __init__(self, api, partner_app, user, runtime):
        self.api, self.p, self.user, self.runtime = api, partner_app, user, runtime
        self.phase = "before"
        self.results: list[dict] = []
        self._stop = asyncio.Event()
        self._task = None

    async def one_launch(self) -> dict:
        # A fresh hub session token each time: some tests move the clock by days.
        hub = {"Authorization": f"Bearer {issue_sandbox_token(self.runtime, self.user)}"}
        status, _, body = await self.api.call("POST", "/v1/sandbox/launches", {"client_id": self.p.app.client_id},
                                              headers=hub)
        assert status == 201, body
        status, headers, _ = await fetch(self.api, body["launch_url"])          # the app's launch endpoint
        assert status == 302, status
        status, headers, body = await fetch(self.api, headers["Location"])      # authorize
        assert status == 302, body
        code = urllib.parse.parse_qs(urllib.parse.urlsplit(headers["Location"]).query)["code"][0]
        status, _, _ = await fetch(self.api, headers["Location"])  # the main page (the app checks state)
        assert status == 200
        phase, calls = self.phase, self.p.state.platform.token_calls
        status, _, body = await fetch(self.api, f"{self.p.url}/api/token", "POST", {"code": code},
                                      {"Content-Type": "application/json"})
        outcome = {"phase": phase, "phase_after": self.phase, "status": status, "body": body,
                   "token_calls": self.p.state.platform.token_calls - calls, "verified": False}
        if status == 200:  # the SDK hands the access token to the platform, which verifies it
            v_status, _, v_body = await self.api.call("POST", "/v1/oauth/introspect",
                                                      {"token": body["access_token"]}, headers=hub)
            outcome["verified"] = v_status == 200 and v_body["active"] is True
        return outcome

    async def _run(self):
        while not self._stop.is_set():
            self.results.append(await self.one_launch())

    def start(self):
        self._task = asyncio.ensure_future(self._run())

    async def during(self, phase: str, launches: int = 3):
        """Enter `phase` and let at least `launches` complete entirely inside it."""
        self.phase = phase
        while len(self.inside(phase)) < launches:
            assert not self._task.done(), self._task.exception()
            await asyncio.sleep(0.01)

    def inside(self, phase: str) -> list[dict]:
        return [r for r in self.results if r["phase"] == r["phase_after"] == phase]

    async def stop(self) -> list[dict]:
        self._stop.set()
        await self._task
        return self.results


async def verify_on_platform(api, flow, world):
    """One launch, as the hub does it: tokens, then the platform verifies the access token."""
    tokens = await flow.tokens()
    await platform_verifies(api, world, tokens["access_token"])
    return tokens


async def platform_verifies(api, world, access_token):
    """What the hub does with the token the SDK hands it (with a fresh hub session token)."""
    hub_token = issue_sandbox_token(api.runtime, world.physician)
    status, _, body = await api.call("POST", "/v1/oauth/introspect", {"token": access_token},
                                     headers={"Authorization": f"Bearer {hub_token}"})
    assert status == 200 and body["active"] is True
