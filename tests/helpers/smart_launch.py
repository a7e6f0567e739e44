"""A SMART launch over HTTP against a live `svc-auth serve`, as an app does: launch -> authorize -> token."""
from __future__ import annotations

import json
import urllib.parse

from helpers import as_service
from js_support import http


def launch_tokens(live: str, runtime, user, app, secret: str, scope: str) -> dict:
    """The token response of a launch by `user` (signed in to the sandbox hub) of `app`, asking `scope`."""
    from hub.sandbox import issue_sandbox_token
    as_live = as_service(runtime, live)
    status, _, body = http("POST", f"{live}/v1/sandbox/launches", json.dumps({"client_id": app.client_id}).encode(),
                           {"Authorization": f"Bearer {issue_sandbox_token(as_live, user)}",
                            "Content-Type": "application/json"})
    assert status == 201, body
    query = {"client_id": app.client_id, "redirect_uri": app.redirect_uri, "response_type": "code",
             "launch": json.loads(body)["launch_id"], "scope": scope}
    status, headers, body = http("GET", f"{live}/v1/oauth/authorize?{urllib.parse.urlencode(query)}")
    assert status == 302, body
    location = urllib.parse.parse_qs(urllib.parse.urlsplit(headers["Location"]).query)
    assert "code" in location, location
    status, _, body = http("POST", f"{live}/v1/oauth/token", json.dumps({
        "grant_type": "authorization_code", "client_id": app.client_id, "client_secret": secret,
        "code": location["code"][0]}).encode(), {"Content-Type": "application/json"})
    assert status == 200, body
    return json.loads(body)
