"""The launch flow over HTTP (`Flow`): launch -> authorize -> token, through the `api` fixture."""
from __future__ import annotations

import urllib.parse


class Flow:
    """Walks the launch flow over HTTP: launch -> authorize -> token."""

    def __init__(self, api, world, runtime):
        self.api, self.world, self.runtime = api, world, runtime

    async def launch(self, sandbox_token=None, client_id=None):
        from hub.sandbox import issue_sandbox_token
        token = sandbox_token or issue_sandbox_token(self.runtime, self.world.physician)
        status, _, body = await self.api.call(
            "POST", "/v1/sandbox/launches", {"client_id": client_id or self.world.app.client_id},
            headers={"Authorization": f"Bearer {token}"})
        assert status == 201, body
        return body["launch_id"]

    async def authorize(self, prefix="/v1", method="GET", **params):
        """GET with the parameters in the query, or POST with them as a form body (OIDC Core 3.1.2.1)."""
        app = self.world.app
        query = {"client_id": app.client_id, "redirect_uri": app.redirect_uri, "response_type": "code"}
        if "launch_id" not in params and "login_hint" not in params:
            query["launch_id"] = await self.launch()
        query.update({k: v for k, v in params.items() if v is not None})
        if method == "POST":
            return await self.api.call("POST", f"{prefix}/oauth/authorize", body=urllib.parse.urlencode(query),
                                        headers={"Content-Type": "application/x-www-form-urlencoded"})
        status, headers, body = await self.api.call("GET", f"{prefix}/oauth/authorize?{urllib.parse.urlencode(query)}")
        return status, headers, body

    async def code(self, prefix="/v1", **params):
        status, headers, body = await self.authorize(prefix, **params)
        assert status == 302, body
        location = urllib.parse.urlsplit(headers["Location"])
        return urllib.parse.parse_qs(location.query)["code"][0]

    async def exchange(self, code, prefix="/v1", secret=None, **extra):
        app = self.world.app
        body = {"grant_type": "authorization_code", "client_id": app.client_id,
                "client_secret": secret or self.world.secret, "code": code, **extra}
        return await self.api.call("POST", f"{prefix}/oauth/token", body)

    async def tokens(self, prefix="/v1"):
        status, headers, body = await self.exchange(await self.code(prefix), prefix)
        assert status == 200, body
        return body


def authorize_at(live: str, runtime, user, app, **params):
    """`GET /v1/oauth/authorize` at a live `svc-auth serve` for a fresh launch of `app` by `user`
    (client_id, the registered redirect_uri and response_type=code unless `params` say otherwise):
    (status, headers, body bytes), the redirect not followed."""
    import json
    from helpers.http import http
    from helpers.tokens import as_service
    from hub.sandbox import issue_sandbox_token
    status, _, body = http("POST", f"{live}/v1/sandbox/launches", json.dumps({"client_id": app.client_id}).encode(),
                           {"Authorization": f"Bearer {issue_sandbox_token(as_service(runtime, live), user)}",
                            "Content-Type": "application/json"})
    assert status == 201, body
    query = {"client_id": app.client_id, "redirect_uri": app.redirect_uri, "response_type": "code",
             "launch_id": json.loads(body)["launch_id"], **params}
    return http("GET", f"{live}/v1/oauth/authorize?{urllib.parse.urlencode(query)}")
