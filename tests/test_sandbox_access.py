"""The sandbox is a testing tool, not a backdoor: off by default, sign-in links and sessions,
only sandbox users, only the platform records a verification, sign-in attempts throttled."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.parse

import pytest

from helpers.environment import ROOT
from helpers.hub import sandbox_signin
from helpers.processes import settings_env
from helpers.throttle import expected_waits, just_before_a_boundary
from lifecycle.applications import install_application
from lifecycle.organizations import create_organization
from lifecycle.users import create_user
from hub.sandbox import SESSION_COOKIE, create_signin_link, issue_sandbox_token
from models.application import Authorization, Installation
from models.appointments import ConnectorSession
from models.audit import AuditEvent
from errors import ApiError
from oauth.tokens import SANDBOX_AUDIENCE
from ratelimit.failures import build_failure_throttle

SANDBOX_PAGES = ["/sandbox/hub", "/sandbox/settings", "/sandbox/signin", "/sandbox/signin/abc", "/sandbox/api/apps"]


def cli(settings, *args):
    return subprocess.run([sys.executable, "-m", "cli.__main__", *args], env=settings_env(settings),
                          cwd=str(ROOT), capture_output=True, text=True)


@pytest.mark.gen_test
async def test_sandbox_off_every_route_is_404(api, world, runtime):
    runtime.settings = runtime.settings.replace(sandbox=False)
    for path in SANDBOX_PAGES + [f"/sandbox/hub?user={world.physician.id}",
                                 f"/sandbox/settings?user={world.physician.id}"]:
        status, _, body = await api.call("GET", path)
        assert status == 404 and body["error"] == "not_found", path
    status, _, _ = await api.call("POST", "/v1/sandbox/launches", {"client_id": world.app.client_id},
                                  headers={"Authorization": f"Bearer {world.sandbox_token}"})
    assert status == 404
    status, _, _ = await api.call("POST", "/sandbox/signout", body="")
    assert status == 404
    # No sandbox token verifies anything while the sandbox is off.
    status, _, body = await api.call("POST", "/v1/oauth/introspect", {"token": "x"},
                                     headers={"Authorization": f"Bearer {world.sandbox_token}"})
    assert status == 401


def test_sandbox_cli_refuses_when_off_or_for_other_users(runtime, settings, world):
    off = settings.replace(sandbox=False)
    for args in (["sandbox", "token", "--user", world.physician.id],
                 ["sandbox", "signin-link", "--user", world.physician.id]):
        result = cli(off, *args)
        assert result.returncode != 0 and "SVC_SANDBOX" in result.stderr and not result.stdout
    clinic = create_organization("Real Clinic", "epic", "https://epic.example")
    real = create_user(clinic.id, "real@clinic.example", "Real", "Doctor")
    for args in (["sandbox", "token", "--user", real.id], ["sandbox", "signin-link", "--user", real.id]):
        result = cli(settings, *args)
        assert result.returncode != 0 and "sandbox" in result.stderr and not result.stdout
    result = cli(settings, "sandbox", "signin-link", "--user", world.physician.id, "--app", world.app.id,
                 "--json")
    assert result.returncode == 0, result.stderr
    url = json.loads(result.stdout)["url"]
    assert url.startswith(settings.public_url + "/sandbox/signin/")
    plain = cli(settings, "sandbox", "signin-link", "--user", world.physician.id)
    assert plain.returncode == 0 and plain.stdout.strip().startswith("http") and len(plain.stdout.split()) == 1


@pytest.mark.gen_test
async def test_user_parameter_identifies_nobody(api, world):
    for path in ("/sandbox/hub", "/sandbox/settings", f"/sandbox/hub?user={world.physician.id}",
                 f"/sandbox/settings?user={world.physician.id}"):
        status, headers, body = await api.call("GET", path)
        assert status == 302 and headers["Location"] == "/sandbox/signin", path
        assert "eyJ" not in str(body)  # no token in the answer
    status, headers, page = await api.call("GET", "/sandbox/signin")
    assert status == 200 and "svc-auth sandbox signin-link" in page
    status, _, _ = await api.call("GET", "/sandbox/hub", headers={"Cookie": f"{SESSION_COOKIE}=forged"})
    assert status == 302


@pytest.mark.gen_test
async def test_signin_link_works_once_and_sets_a_safe_cookie(api, world, runtime):
    url = create_signin_link(runtime, world.physician.id, world.app.id)
    path = urllib.parse.urlsplit(url).path
    status, headers, _ = await api.call("GET", path)
    assert status == 302 and headers["Location"].startswith(f"/sandbox/hub?app={world.app.id}&open=")
    cookie = headers["Set-Cookie"]
    assert cookie.startswith(SESSION_COOKIE + "=") and "HttpOnly" in cookie and "SameSite=Lax" in cookie
    assert "Path=/sandbox" in cookie and "Secure" not in cookie
    status, _, page = await api.call("GET", headers["Location"], headers={"Cookie": cookie.split(";")[0]})
    assert status == 200 and 'id="app-frame"' in page and world.physician.display_name in page
    status, headers, page = await api.call("GET", path)  # the second use
    assert status == 401 and "Set-Cookie" not in headers and "not valid" in page
    # An expired link is refused the same way.
    url = create_signin_link(runtime, world.physician.id)
    runtime.clock.advance(runtime.settings.sandbox_link_ttl + 1)
    assert (await api.call("GET", urllib.parse.urlsplit(url).path))[0] == 401


@pytest.mark.gen_test
async def test_cookie_is_secure_under_https(api, world, runtime):
    runtime.settings = runtime.settings.replace(public_url="https://svc.example")
    url = create_signin_link(runtime, world.physician.id)
    status, headers, _ = await api.call("GET", urllib.parse.urlsplit(url).path)
    assert status == 302 and "Secure" in headers["Set-Cookie"]


@pytest.mark.gen_test
async def test_only_sandbox_users(api, world, runtime):
    clinic = create_organization("Real Clinic", "epic", "https://epic.example")
    real = create_user(clinic.id, "real@clinic.example", "Real", "Doctor")
    with pytest.raises(ApiError):
        create_signin_link(runtime, real.id)
    with pytest.raises(ApiError):
        issue_sandbox_token(runtime, real)
    # A sandbox-audience token for such a user (say, minted before the clinic moved EHR) is refused.
    token, _ = runtime.tokens.access_token(real.id, SANDBOX_AUDIENCE, 600, org=clinic.id)
    status, _, body = await api.call("POST", "/v1/sandbox/launches", {"client_id": world.app.client_id},
                                     headers={"Authorization": f"Bearer {token}"})
    assert status == 401 and body == {"error": "invalid_token", "message": "Authentication failed"}


@pytest.mark.gen_test
async def test_sign_in_opens_and_sign_out_ends_the_sessions(api, world, runtime):
    user = world.physician
    signed_in_at = runtime.clock.time()
    cookie, location = await sandbox_signin(api, runtime, user.id)
    assert ConnectorSession.select().where((ConnectorSession.user == user.id)
                                           & ConnectorSession.ended_at.is_null()).count() == 1
    runtime.clock.advance(120)
    status, _, page = await api.call("GET", "/sandbox/settings", headers=cookie)
    assert status == 200
    token = re.search(r'<textarea id="sandbox-token"[^>]*>([^<]+)</textarea>', page).group(1).strip()
    claims = runtime.tokens.verify(token, SANDBOX_AUDIENCE)
    assert abs(claims["auth_time"] - signed_in_at) <= 2 and claims["iat"] - claims["auth_time"] >= 118
    assert 'action="/sandbox/signout"' in page
    # A form on another site: refused, and the cookie is not cleared (its POST sends no Lax cookie,
    # but the answer's clearing Set-Cookie signed the user out).
    status, headers, _ = await api.call("POST", "/sandbox/signout", body="",
                                        headers={**cookie, "Origin": "https://evil.example"})
    assert status == 403 and "Set-Cookie" not in headers
    assert (await api.call("GET", "/sandbox/settings", headers=cookie))[0] == 200
    own = runtime.settings.public_url
    status, headers, _ = await api.call("POST", "/sandbox/signout", body="", headers={**cookie, "Origin": own})
    assert status == 302 and headers["Location"] == "/sandbox/signin"
    assert f"{SESSION_COOKIE}=;" in headers["Set-Cookie"] or 'Max-Age=0' in headers["Set-Cookie"] \
        or "expires=" in headers["Set-Cookie"].lower()
    assert (await api.call("GET", "/sandbox/hub", headers=cookie))[0] == 302  # the old cookie is dead
    assert ConnectorSession.select().where((ConnectorSession.user == user.id)
                                           & ConnectorSession.ended_at.is_null()).count() == 0


@pytest.mark.gen_test
async def test_signin_attempts_are_throttled_per_address(api, world, runtime):
    """At most the limit in any window's span (the count slides: failures before what was a fixed
    window's boundary still count after it); locked until the first of them is a window old."""
    clock = runtime.clock
    runtime.settings = runtime.settings.replace(auth_address_failure_limit=(5, 300))
    runtime.sandbox_signin_throttle = build_failure_throttle(runtime.settings, "sandbox_signin",
                                                             runtime.failure_policy(), lambda: runtime.clock.time())
    just_before_a_boundary(clock, 300, lead=5)
    first = clock.time()
    assert (await api.call("GET", "/sandbox/signin/guess0"))[0] == 401
    oldest = (first, clock.time())
    for n in range(1, 4):
        assert (await api.call("GET", f"/sandbox/signin/guess{n}"))[0] == 401
    clock.advance(10)  # past the boundary
    assert (await api.call("GET", "/sandbox/signin/guess4"))[0] == 401
    good = urllib.parse.urlsplit(create_signin_link(runtime, world.physician.id)).path
    before = clock.time()
    status, headers, _ = await api.call("GET", good)
    refused = (before, clock.time())
    assert status == 429 and int(headers["Retry-After"]) in expected_waits(oldest, refused, 300), headers
    assert AuditEvent.select().where((AuditEvent.action == "auth.lockout")).count() == 1
    clock.advance(refused[1] + int(headers["Retry-After"]) - clock.time())
    assert (await api.call("GET", good))[0] == 302  # not consumed while locked


@pytest.mark.gen_test
async def test_only_the_platform_records_a_verification(api, flow, world, runtime):
    """The attack of issue 12: a partner app lists users, takes one's token, runs the launch and
    the code exchange itself and introspects "as the platform". Each step is now closed."""
    app, secret, user = world.app, world.secret, world.physician
    # The settings page hands out nothing without a sandbox session.
    status, _, body = await api.call("GET", f"/sandbox/settings?user={user.id}")
    assert status == 302 and "eyJ" not in str(body)
    tokens = await flow.tokens()  # the app has a real access token (and ID token) for the user
    client_token = (await api.call("POST", "/v1/oauth/token", {
        "grant_type": "client_credentials", "client_id": app.client_id, "client_secret": secret}))[2]["access_token"]
    # With its own client credentials: an ordinary introspection, no verification.
    status, _, body = await api.call("POST", "/v1/oauth/introspect", {
        "token": tokens["access_token"], "client_id": app.client_id, "client_secret": secret})
    assert status == 200 and body["active"] is True
    # With any token it holds as the Bearer: refused.
    for bearer in (tokens["access_token"], tokens["id_token"], client_token):
        status, _, _ = await api.call("POST", "/v1/oauth/introspect", {"token": tokens["access_token"]},
                                      headers={"Authorization": f"Bearer {bearer}"})
        assert status == 401
    assert Authorization.select().count() == 0
    assert Installation.find(app.id, world.org.id).activation_status is None
    # The platform (the hub, with the signed-in user's sandbox token) records it.
    cookie, _ = await sandbox_signin(api, runtime, user.id)
    _, _, page = await api.call("GET", "/sandbox/hub", headers=cookie)
    hub_token = json.loads(re.search(r'<script id="hub-data" type="application/json">(.*?)</script>', page,
                                     re.S).group(1))["sandboxToken"]
    status, _, body = await api.call("POST", "/v1/oauth/introspect", {"token": tokens["access_token"]},
                                     headers={"Authorization": f"Bearer {hub_token}"})
    assert status == 200 and body["active"] is True
    assert Authorization.select().where(Authorization.user == user.id).count() == 1


@pytest.mark.gen_test
async def test_invitation_signs_in_only_with_the_sandbox_on(api, world, runtime):
    from partner_api.invitations import invite
    answer = invite(runtime, world.app, {"email": "new@clinic.example", "given_name": "New",
                                            "family_name": "Person", "organization_name": "New Clinic"})
    runtime.settings = runtime.settings.replace(sandbox=False)
    status, headers, body = await api.call("GET", urllib.parse.urlsplit(answer["invitation_url"]).path)
    assert status == 200 and body["status"] == "accepted" and "Set-Cookie" not in headers
    install_application(world.app.id, answer["organization_id"])
