"""`apps create --allowed-origin`: CORS for that application's browser calls, over real HTTP."""
import dataclasses
from typing import Any

import pytest

from helpers.http import basic_auth
from helpers.worlds import World

APP_ORIGIN = "https://notes.example"
OTHER_ORIGIN = "https://evil.example"


@dataclasses.dataclass
class CorsWorld(World):
    """`world` with a browser app (an allowed origin) in place of its app, and a second app."""
    other: Any = None
    other_secret: str = ""


@pytest.fixture
def cors_world(world, runtime) -> CorsWorld:
    from lifecycle.applications import install_application, register_application
    app, secret = register_application(runtime, "Browser App", "https://notes.example/app",
                                       "https://notes.example/launch", allowed_origins=["HTTPS://Notes.Example:443"])
    other, other_secret = register_application(runtime, "Other App", "https://other.example/app",
                                               "https://other.example/launch", allowed_origins=[OTHER_ORIGIN])
    install_application(app.id, world.org.id)
    return CorsWorld(**{**vars(world), "app": app, "secret": secret}, other=other, other_secret=other_secret)


@pytest.mark.gen_test
@pytest.mark.parametrize("path", ["/v1/oauth/token", "/v1/oauth/userinfo", "/v1/oauth/introspect",
                                  "/os-api/v2/oauth/token"])
async def test_preflight_is_answered_for_registered_origins_only(api, cors_world, path):
    headers = {"Origin": APP_ORIGIN, "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "authorization, content-type"}
    status, h, _ = await api.call("OPTIONS", path, headers=headers)
    assert status == 204
    assert h["Access-Control-Allow-Origin"] == APP_ORIGIN
    assert "POST" in h["Access-Control-Allow-Methods"] and "Authorization" in h["Access-Control-Allow-Headers"]
    status, h, _ = await api.call("OPTIONS", path, headers={**headers, "Origin": "https://unknown.example"})
    assert status == 204 and "Access-Control-Allow-Origin" not in h


@pytest.mark.gen_test
async def test_responses_are_readable_only_by_the_calling_apps_origin(api, cors_world, runtime):
    from helpers.launch import Flow
    app, secret = cors_world.app, cors_world.secret
    code = await Flow(api, cors_world, runtime).code()
    body = {"grant_type": "authorization_code", "code": code, "client_id": app.client_id, "client_secret": secret}
    status, h, tokens = await api.call("POST", "/v1/oauth/token", body, headers={"Origin": APP_ORIGIN})
    assert status == 200, tokens
    assert h["Access-Control-Allow-Origin"] == APP_ORIGIN and "Origin" in h["Vary"]

    # userinfo: the access token names the app
    status, h, info = await api.call("GET", "/v1/oauth/userinfo",
                                     headers={"Authorization": f"Bearer {tokens['access_token']}", "Origin": APP_ORIGIN})
    assert status == 200 and h["Access-Control-Allow-Origin"] == APP_ORIGIN
    # another app's registered origin cannot read this app's answers
    status, h, _ = await api.call("GET", "/v1/oauth/userinfo",
                                  headers={"Authorization": f"Bearer {tokens['access_token']}", "Origin": OTHER_ORIGIN})
    assert status == 200 and "Access-Control-Allow-Origin" not in h

    # introspection with HTTP Basic: the client named there decides
    status, h, result = await api.call(
        "POST", "/v1/oauth/introspect", body=f"token={tokens['access_token']}",
        headers={"Authorization": basic_auth(app.client_id, secret), "Origin": APP_ORIGIN,
                 "Content-Type": "application/x-www-form-urlencoded"})
    assert status == 200 and result["active"] and h["Access-Control-Allow-Origin"] == APP_ORIGIN

    # an error answer is readable by the app's origin too (the browser code can show it)
    status, h, error = await api.call("POST", "/v1/oauth/token", {**body, "client_secret": "wrong"},
                                      headers={"Origin": APP_ORIGIN})
    assert status == 401 and error["error"] == "invalid_client"
    assert h["Access-Control-Allow-Origin"] == APP_ORIGIN

    # the other app's origin, naming this app's client_id: no CORS header
    status, h, _ = await api.call("POST", "/v1/oauth/token", body, headers={"Origin": OTHER_ORIGIN})
    assert "Access-Control-Allow-Origin" not in h
    # no Origin (a server-side call): no CORS headers at all
    status, h, _ = await api.call("POST", "/v1/oauth/token", body)
    assert "Access-Control-Allow-Origin" not in h


def test_allowed_origin_must_be_an_origin(runtime):
    from lifecycle.applications import register_application
    from errors import ApiError
    with pytest.raises(ApiError, match="scheme://host"):
        register_application(runtime, "A", "https://a.example/app", "https://a.example/launch",
                             allowed_origins=["https://a.example/path"])
