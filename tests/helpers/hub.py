"""The sandbox hub over HTTP: a session driven as a physician's browser would (`Hub`), and signing in
to the sandbox EHR with a one-time link (`sandbox_signin`)."""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request

from hub.sandbox import issue_sandbox_token


async def sandbox_signin(api, runtime, user_id: str, app: str | None = None, target: str = "hub"):
    """Sign in to the sandbox EHR the way a person does (a one-time link); returns (Cookie header
    dict, the link's redirect Location)."""
    from hub.sandbox import SESSION_COOKIE, create_signin_link
    url = create_signin_link(runtime, user_id, app, target=target)
    status, headers, body = await api.call("GET", urllib.parse.urlsplit(url).path)
    assert status == 302, body
    cookies = [c for c in headers.get_list("Set-Cookie") if c.startswith(SESSION_COOKIE + "=")]
    assert cookies, headers
    return {"Cookie": cookies[0].split(";")[0]}, headers["Location"]


def hub_page_at(settings, live: str, user_id: str, timeout: float = 60) -> str:
    """The physician's hub page as the `serve` at `live` renders it, signed in the way a person is:
    `svc-auth sandbox signin-link` (a child process), its link opened without following the
    redirect, then `/sandbox/hub` with the session cookie it set."""
    from helpers.environment import ROOT
    from helpers.processes import settings_env
    done = subprocess.run([sys.executable, "-m", "cli.__main__", "sandbox", "signin-link", "--user", user_id, "--json"],
                          env=settings_env(settings), cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    link = urllib.parse.urlsplit(json.loads(done.stdout)["url"])

    class Stay(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None
    opener = urllib.request.build_opener(Stay)
    try:
        opener.open(f"{live}{link.path}?{link.query}", timeout=30)
        raise AssertionError("the sign-in link did not redirect")
    except urllib.error.HTTPError as redirect:
        assert redirect.code == 302
        cookie = redirect.headers["Set-Cookie"].split(";")[0]
    request = urllib.request.Request(f"{live}/sandbox/hub", headers={"Cookie": cookie, "Accept": "text/html"})
    with opener.open(request, timeout=timeout) as response:
        return response.read().decode()


class Hub:
    """A user of the sandbox EHR, driving the hub's HTTP calls as hub.js does."""

    def __init__(self, api, runtime, app, secret, user):
        self.api, self.runtime, self.app, self.secret, self.user = api, runtime, app, secret, user
        self.sandbox_token = issue_sandbox_token(runtime, user)
        self.auth = {"Authorization": f"Bearer {self.sandbox_token}"}

    async def open_app(self) -> str:
        """Open the app (launch), the app's page gets a code, its backend exchanges it: the access token."""
        status, _, body = await self.api.call("POST", "/v1/sandbox/launches", {"client_id": self.app.client_id},
                                              headers=self.auth)
        assert status == 201, body
        query = {"client_id": self.app.client_id, "redirect_uri": self.app.redirect_uri, "response_type": "code",
                 "launch_id": body["launch_id"]}
        status, headers, body = await self.api.call("GET", f"/v1/oauth/authorize?{urllib.parse.urlencode(query)}")
        assert status == 302, body
        code = urllib.parse.parse_qs(urllib.parse.urlsplit(headers["Location"]).query)["code"][0]
        status, _, tokens = await self.api.call("POST", "/v1/oauth/token", {
            "grant_type": "authorization_code", "client_id": self.app.client_id, "client_secret": self.secret,
            "code": code})
        assert status == 200, tokens
        return tokens["access_token"]

    async def verify(self, access_token: str) -> None:
        """The platform verifies the app's access token (the SDK hands it to the hub)."""
        status, _, body = await self.api.call("POST", "/v1/oauth/introspect", {"token": access_token},
                                              headers=self.auth)
        assert status == 200 and body["active"], body

    async def poll(self) -> None:
        status, _, body = await self.api.call("GET", "/sandbox/api/apps", headers=self.auth)
        assert status == 200 and body["apps"], body

    async def complete_flow(self) -> None:
        await self.verify(await self.open_app())
        await self.poll()
