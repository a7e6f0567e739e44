"""`apps create --allowed-origin`: CORS for that application's browser calls, over real HTTP; the
preflight's registered origins held in memory and following changes made by any process."""
import asyncio
import dataclasses
from typing import Any

import pytest

from helpers.http import basic_auth, http
from helpers.processes import free_port, settings_env, start_process, stop_process, wait_until
from helpers.statements import StatementCounter
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


def preflight_allows(base: str, origin: str) -> bool:
    """A real preflight from `origin` to the token endpoint of `base` is answered for it."""
    status, headers, _ = http("OPTIONS", f"{base}/v1/oauth/token", None,
                              {"Origin": origin, "Access-Control-Request-Method": "POST"})
    assert status == 204
    return headers.get("Access-Control-Allow-Origin") == origin


def every_process(base: str, origin: str, allowed: bool) -> bool:
    """Ten preflights, each on a new connection (spread over the serve processes), all answer `allowed`."""
    return all(preflight_allows(base, origin) == allowed for _ in range(10))


@pytest.fixture
def two_processes(settings, cors_world, tmp_path):
    """`svc-auth serve --processes 2` over the test's database and `cors_world`; yields its address."""
    port = free_port()
    proc = start_process(["serve", "--port", str(port), "--processes", "2"], settings_env(settings), port,
                         log_path=tmp_path / "serve.log")
    yield f"http://127.0.0.1:{port}"
    stop_process(proc)


@pytest.mark.slow
def test_preflights_follow_origin_changes_made_by_other_processes(two_processes, cors_world, cli):
    """The serve processes hold every registered origin in memory; an origin added, replaced or
    deleted by the CLI (another process, as another host would be) is answered accordingly within
    the change feed's poll, as the rest of an application's settings are."""
    from models.application import DISABLED, Installation
    app, other, new = cors_world.app, cors_world.other, "https://new.example"
    for origin, allowed in ((APP_ORIGIN, True), (OTHER_ORIGIN, True), (new, False)):  # and held in memory
        wait_until(lambda: every_process(two_processes, origin, allowed), 10, f"{origin} allowed={allowed}")

    cli("apps", "update", "--app", app.id, "--allowed-origin", "HTTPS://New.Example:443", "--json")
    wait_until(lambda: every_process(two_processes, new, True), 10, "the added origin")
    assert every_process(two_processes, APP_ORIGIN, False)  # replaced: refused
    assert every_process(two_processes, OTHER_ORIGIN, True)

    # A disabled installation changes nothing: a preflight names no application (the real request,
    # which does, is refused by the installation's check).
    Installation.update(activation_status=DISABLED).where(Installation.application == app.id).execute()
    assert every_process(two_processes, new, True)

    cli("apps", "delete", "--app", other.id, "--yes", "--json")
    wait_until(lambda: every_process(two_processes, OTHER_ORIGIN, False), 10, "the deleted app's origin refused")
    cli("apps", "update", "--app", app.id, "--no-allowed-origins", "--json")
    wait_until(lambda: every_process(two_processes, new, False), 10, "the removed origin refused")


@pytest.mark.gen_test
async def test_a_preflight_reads_no_application_once_the_origins_are_held(api, cors_world, runtime):
    """Every preflight (unauthenticated, from anyone) read and normalized every application's
    origins: the applications table scanned per request. The registered origins are now read once
    after each change to applications, then answered from memory with no database round trip."""
    from lifecycle.applications import register_application
    from lifecycle.manifest import update_manifest
    for i in range(40):
        register_application(runtime, f"App {i}", f"https://app{i}.example/cb", f"https://app{i}.example/launch",
                             allowed_origins=[f"https://app{i}.example"])

    async def allows(origin: str) -> bool:
        status, headers, _ = await api.call("OPTIONS", "/v1/oauth/token",
                                            headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
        assert status == 204
        return headers.get("Access-Control-Allow-Origin") == origin
    with StatementCounter(runtime.db) as counter:
        assert await allows(APP_ORIGIN)
        assert len(counter.statements) == 1  # every application's origins, read once
        counter.reset()
        for origin in (APP_ORIGIN, "https://app39.example", "https://APP7.example:443", OTHER_ORIGIN):
            assert await allows(origin), origin
        for origin in ("https://unknown.example", "null", "https://app1.example/path", "http://app1.example",
                       "https://" + "x" * 4000 + ".example"):
            assert not await allows(origin), origin
        assert counter.statements == []
    # A change to any application is announced: the origins are read again, once for a burst.
    update_manifest(runtime, cors_world.app.id, "operator", allowed_origins=["https://moved.example"])
    with StatementCounter(runtime.db) as counter:
        answers = await asyncio.gather(*(allows(o) for o in ["https://moved.example", APP_ORIGIN] * 5))
        assert answers == [True, False] * 5 and len(counter.statements) == 1
