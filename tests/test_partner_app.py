"""The example partner app against the real service, over HTTP on both databases.

The service (pytest-tornado's `app`) and the example app run on the same IOLoop on two loopback
ports; the example app reaches the service's token, userinfo and JWKS endpoints for real.
"""
from __future__ import annotations

import datetime as dt
import base64
import json
import urllib.parse

import pytest
from jose import jwt

from billing.free_trial import TRIAL_DAYS
from oauth.secret_rotation import activate_fallback_secret, generate_fallback_secret
from models.application import Installation
from helpers.partner_app import PARTNER_SETTINGS, fetch

pytestmark = PARTNER_SETTINGS










async def code_via_launch(api, p, user):
    """Platform -> app launch endpoint -> service authorize -> the code on the redirect_uri."""
    status, headers, _ = await fetch(api, f"{p.url}/launch?{urllib.parse.urlencode(p.launch_query(user))}")
    assert status == 302, headers
    status, headers, body = await fetch(api, headers["Location"])
    assert status == 302, body
    location = urllib.parse.urlsplit(headers["Location"])
    assert location.netloc == f"127.0.0.1:{p.port}"
    status, _, _ = await fetch(api, headers["Location"])  # the browser lands on the main page (state checked)
    assert status == 200
    return urllib.parse.parse_qs(location.query)["code"][0], location


async def app_token(api, p, code, origin=None):
    headers = {"Content-Type": "application/json"}
    if origin:
        headers["Origin"] = origin
    return await fetch(api, f"{p.url}/api/token", "POST", {"code": code}, headers)


@pytest.mark.gen_test
async def test_launch_redirects_to_authorize_with_the_spec_parameters(api, partner, world):
    p = partner()
    query = p.launch_query(world.physician)
    status, headers, _ = await fetch(api, f"{p.url}/launch?{urllib.parse.urlencode(query)}")
    assert status == 302
    target = urllib.parse.urlsplit(headers["Location"])
    assert f"{target.scheme}://{target.netloc}{target.path}" == api.base_url.replace("localhost", "127.0.0.1") + "/v1/oauth/authorize"
    sent = dict(urllib.parse.parse_qsl(target.query))
    assert {k: sent.pop(k) for k in ("launch_id", "client_id", "redirect_uri", "response_type")} == {
        "launch_id": query["launch_id"], "client_id": p.app.client_id, "redirect_uri": f"{p.url}/app",
        "response_type": "code"}
    # state, nonce and PKCE S256, all fresh per launch
    assert set(sent) == {"state", "nonce", "code_challenge", "code_challenge_method"}
    assert sent["code_challenge_method"] == "S256" and len(sent["code_challenge"]) == 43
    assert len(sent["state"]) >= 32 and len(sent["nonce"]) >= 32


@pytest.mark.gen_test
async def test_partner_app_exchanges_only_codes_of_its_own_requests(api, partner, world):
    """The app keeps the PKCE verifier per state: a code without its state, or whose state was
    forged, is never exchanged; a good one is exchanged with its verifier and nonce checked."""
    p = partner()
    status, headers, _ = await fetch(api, f"{p.url}/launch?{urllib.parse.urlencode(p.launch_query(world.physician))}")
    status, headers, _ = await fetch(api, headers["Location"])
    location = urllib.parse.urlsplit(headers["Location"])
    params = urllib.parse.parse_qs(location.query)
    forged = location._replace(query=urllib.parse.urlencode({"code": params["code"][0], "state": "forged"}))
    assert (await fetch(api, urllib.parse.urlunsplit(forged)))[0] == 200
    status, _, body = await app_token(api, p, params["code"][0])
    assert status == 400 and body["error"] == "invalid_grant"
    code, _ = await code_via_launch(api, p, world.physician)
    status, _, body = await app_token(api, p, code)
    assert status == 200, body
    claims = json.loads(base64.urlsafe_b64decode(body["id_token"].split(".")[1] + "=="))
    assert claims["nonce"]


@pytest.mark.gen_test
async def test_multi_tenant_redirect_uri_and_ehr_deny_list(api, partner, world):
    p = partner(multi_tenant=True, ehr_deny=("https://ehr.example/",))
    query = p.launch_query(world.physician)
    status, _, body = await fetch(api, f"{p.url}/launch?{urllib.parse.urlencode(query)}")
    assert status == 403 and body["error"] == "ehr_not_allowed"
    query["ehr_url"] = "https://other-ehr.example/x"
    status, headers, _ = await fetch(api, f"{p.url}/launch?{urllib.parse.urlencode(query)}")
    assert status == 302
    redirect_uri = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(headers["Location"]).query))["redirect_uri"]
    assert redirect_uri == f"{p.url}/app/{world.org.id}"
    status, headers, _ = await fetch(api, headers["Location"])  # the service accepts it: under the base URL
    assert status == 302 and headers["Location"].startswith(redirect_uri + "?code=")
    status, _, body = await fetch(api, f"{p.url}/launch")
    assert status == 400 and body["error"] == "invalid_request"


@pytest.mark.gen_test
async def test_authorized_physician_gets_the_token_response(api, partner, world):
    p = partner()
    code, _ = await code_via_launch(api, p, world.physician)
    status, headers, body = await app_token(api, p, code)
    assert status == 200, body
    assert headers["Cache-Control"] == "no-store"
    assert set(body) >= {"access_token", "id_token"}
    claims = jwt.get_unverified_claims(body["id_token"])
    assert claims["sub"] == world.physician.id and claims["aud"] == p.app.client_id
    # The app learned the clinic from userinfo (used by "Enable for this clinic").
    assert p.state.records.organization_of[world.physician.id] == world.org.id
    # A code is single-use: the second exchange is refused, clearly.
    status, _, body = await app_token(api, p, code)
    assert status == 400 and body["error"] == "invalid_grant"


@pytest.mark.gen_test
async def test_user_not_in_the_app_records_gets_403(api, partner, world):
    p = partner()
    code, _ = await code_via_launch(api, p, world.staff)
    status, _, body = await app_token(api, p, code)
    assert status == 403 and body["error"] == "forbidden"


@pytest.mark.gen_test
async def test_trial_expired_unless_the_clinic_upgraded(api, partner, world, runtime, clock):
    p = partner()
    (Installation.update(activation_status="Enabled", trial_started_at=clock.now() - dt.timedelta(days=TRIAL_DAYS + 1))
     .where(Installation.application == p.app.id).execute())
    code, _ = await code_via_launch(api, p, world.physician)
    status, _, body = await app_token(api, p, code)
    assert status == 403
    assert body["error"] == "trial_expired" and body["message"]

    upgraded = partner(upgraded_organizations={world.org.id})
    (Installation.update(activation_status="Enabled", trial_started_at=clock.now() - dt.timedelta(days=TRIAL_DAYS + 1))
     .where(Installation.application == upgraded.app.id).execute())
    code, _ = await code_via_launch(api, upgraded, world.physician)
    status, _, body = await app_token(api, upgraded, code)
    assert status == 200, body
    assert jwt.get_unverified_claims(body["id_token"])["is_free_trial"] is False


@pytest.mark.gen_test
async def test_rotation_retries_once_with_the_fallback_secret(api, partner, world, runtime):
    p = partner()
    new_secret = generate_fallback_secret(runtime, p.app.id)
    rotated = partner(client_id=p.app.client_id, client_secret=p.secret, fallback_secret=new_secret,
                      application_id=p.app.id)
    rotated.app = p.app
    rotated.state.authorizations = p.state.authorizations  # the same app, restarted with new secrets
    code, _ = await code_via_launch(api, p, world.physician)
    status, _, body = await app_token(api, rotated, code)
    assert status == 200 and rotated.state.platform.token_calls == 1  # current secret still valid
    activate_fallback_secret(runtime, p.app.id)  # step 3: the old secret stops working
    code, _ = await code_via_launch(api, p, world.physician)
    status, _, body = await app_token(api, rotated, code)
    assert status == 200, body
    assert rotated.state.platform.token_calls == 3  # 401 with the old secret, then the fallback
    # Without a fallback the app cannot exchange codes any more: a clear 502, not a crash.
    code, _ = await code_via_launch(api, p, world.physician)
    status, _, body = await app_token(api, p, code)
    assert status == 502 and body["error"] == "token_exchange_failed"


@pytest.mark.gen_test
async def test_jwks_is_fetched_once_and_refreshed_for_an_unknown_kid(api, partner, world, runtime):
    p = partner()
    for _ in range(2):
        code, _ = await code_via_launch(api, p, world.physician)
        assert (await app_token(api, p, code))[0] == 200
    assert p.state.jwks.fetch_count == 1
    before = runtime.keyring.active.kid
    assert runtime.keyring.rotate().kid != before
    runtime.clock.advance(runtime.settings.key_prepublish_seconds)  # the service signs with the new kid now
    code, _ = await code_via_launch(api, p, world.physician)
    status, _, body = await app_token(api, p, code)
    assert status == 200, body
    assert p.state.jwks.fetch_count == 2


@pytest.mark.gen_test
async def test_id_token_verification_rules(partner, runtime, world):
    p = partner(jwks_min_refresh_seconds=60)
    verifier = p.state.verifier
    good = runtime.tokens.sign(runtime.tokens.base_claims(world.physician.id, p.app.client_id, 600))
    assert (await verifier.verify(good))["sub"] == world.physician.id
    from examples.partner_app.id_tokens import InvalidIdToken
    other_aud = runtime.tokens.sign(runtime.tokens.base_claims(world.physician.id, "someone-else", 600))
    with pytest.raises(InvalidIdToken):
        await verifier.verify(other_aud)
    claims = runtime.tokens.base_claims(world.physician.id, p.app.client_id, 600)
    claims["iss"] = runtime.settings.issuer  # without the trailing slash: not the issuer claim
    with pytest.raises(InvalidIdToken):
        await verifier.verify(runtime.tokens.sign(claims))
    expired = runtime.tokens.base_claims(world.physician.id, p.app.client_id, 600)
    expired["exp"] = expired["iat"] - 10
    with pytest.raises(InvalidIdToken):
        await verifier.verify(runtime.tokens.sign(expired))
    unsigned = jwt.encode({"sub": "x", "aud": p.app.client_id}, "secret", algorithm="HS256")
    with pytest.raises(InvalidIdToken):
        await verifier.verify(unsigned)
    forged_kid = jwt.encode(runtime.tokens.base_claims("x", p.app.client_id, 60), runtime.keyring.active.signer,
                            algorithm="RS256", headers={"kid": "not-a-key"})
    for _ in range(3):  # unknown kids do not make the app hammer the JWKS
        with pytest.raises(InvalidIdToken):
            await verifier.verify(forged_kid)
    assert p.state.jwks.fetch_count == 1


@pytest.mark.gen_test
async def test_cors_accepts_the_service_origin_and_refuses_others(api, partner, world):
    p = partner(allowed_origins=(f"{p_origin(api)}", "https://*.svc.example"))
    for origin in (p_origin(api), "https://hub.svc.example"):
        status, headers, _ = await fetch(api, f"{p.url}/api/token", "OPTIONS", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type"})
        assert status == 204
        assert headers["Access-Control-Allow-Origin"] == origin
        assert "POST" in headers["Access-Control-Allow-Methods"]
        assert "Content-Type" in headers["Access-Control-Allow-Headers"]
    for origin in ("https://evil.example", "https://svc.example.evil.test", "null"):
        status, headers, body = await fetch(api, f"{p.url}/api/token", "OPTIONS", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST"})
        assert status == 403 and "Access-Control-Allow-Origin" not in headers
        code, _ = await code_via_launch(api, p, world.physician)
        status, headers, body = await app_token(api, p, code, origin=origin)
        assert status == 403 and body["error"] == "origin_not_allowed"
    code, _ = await code_via_launch(api, p, world.physician)
    status, headers, body = await app_token(api, p, code, origin=p_origin(api))
    assert status == 200 and headers["Access-Control-Allow-Origin"] == p_origin(api)
    status, headers, _ = await fetch(api, f"{p.url}/launch", "OPTIONS", headers={
        "Origin": p_origin(api), "Access-Control-Request-Method": "GET"})
    assert status == 204 and headers["Access-Control-Allow-Origin"] == p_origin(api)


def p_origin(api) -> str:
    return api.base_url.replace("localhost", "127.0.0.1")


@pytest.mark.gen_test
async def test_sso_exchange_turns_the_id_token_into_an_app_session(api, partner, world):
    p = partner()
    code, _ = await code_via_launch(api, p, world.physician)
    tokens = (await app_token(api, p, code))[2]
    status, _, body = await fetch(api, f"{p.url}/api/session", "POST", "{}",
                                  {"Authorization": f"Bearer {tokens['id_token']}"})
    assert status == 200, body
    assert body["user"]["sub"] == world.physician.id
    status, _, me = await fetch(api, f"{p.url}/api/me", headers={"Authorization": f"Bearer {body['session_token']}"})
    assert status == 200 and me["email"] == "doc@example.com"
    for bad in (tokens["access_token"], "nonsense", ""):
        status, _, body = await fetch(api, f"{p.url}/api/session", "POST", "{}", {"Authorization": f"Bearer {bad}"})
        assert status == 401 and body["error"] == "invalid_token"
    status, _, body = await fetch(api, f"{p.url}/api/me", headers={"Authorization": "Bearer nope"})
    assert status == 401 and body["error"] == "invalid_session"


@pytest.mark.gen_test
async def test_main_page_loads_the_sdk_and_may_only_be_framed_by_the_service(api, partner):
    p = partner()
    status, headers, body = await fetch(api, f"{p.url}/app?code=abc")
    assert status == 200
    assert f'<script src="{p_origin(api)}/static/sdk/svc-sdk.js"></script>' in body
    assert 'id="id-token-claims"' in body and 'id="sdk-error"' in body and 'id="enable-clinic"' in body
    csp = headers["Content-Security-Policy"]
    assert f"frame-ancestors {p_origin(api)}" in csp and f"script-src 'self' {p_origin(api)}" in csp
    assert p.secret not in body


@pytest.mark.gen_test
async def test_bad_input_gets_clear_4xx(api, partner):
    p = partner()
    for body in ("not json", "[1]", "{}", '{"code": 5}'):
        status, _, answer = await fetch(api, f"{p.url}/api/token", "POST", body, {"Content-Type": "application/json"})
        assert status == 400 and answer["error"] == "invalid_request", body
    status, _, answer = await app_token(api, p, "no-such-code")
    assert status == 400 and answer["error"] == "invalid_grant"


@pytest.mark.gen_test
async def test_enable_for_this_clinic_calls_the_activation_operation(api, partner, world):
    p = partner()
    probe = await api.call("PUT", f"/v1/applications/{p.app.id}/organizations/{world.org.id}/activation-status",
                           {"status": "Enabled"})
    if probe[0] == 404 and probe[2].get("error") == "not_found":
        pytest.skip("the activation REST operation is not mounted on this branch")
    code, _ = await code_via_launch(api, p, world.physician)
    tokens = (await app_token(api, p, code))[2]
    # As after the first launch: the platform verified the token, the installation is Disabled.
    Installation.update(activation_status="Disabled").where(Installation.application == p.app.id).execute()
    session = (await fetch(api, f"{p.url}/api/session", "POST", "{}",
                           {"Authorization": f"Bearer {tokens['id_token']}"}))[2]
    status, _, body = await fetch(api, f"{p.url}/api/activation", "POST", "{}",
                                  {"Authorization": f"Bearer {session['session_token']}"})
    assert status == 200, body
    assert body["status"] == "Enabled" and body["trial_started_at"]
    assert Installation.find(p.app.id, world.org.id).activation_status == "Enabled"


@pytest.mark.gen_test
async def test_activation_needs_an_app_session_and_a_rest_token(api, partner, world):
    p = partner()
    status, _, body = await fetch(api, f"{p.url}/api/activation", "POST", "{}", {"Authorization": "Bearer nope"})
    assert status == 401 and body["error"] == "invalid_session"
    grant = await p.state.platform.client_credentials()  # what the activation call presents
    assert grant.ok, grant.describe()
    assert grant.body["token_type"] == "Bearer" and grant.body["access_token"]


def test_the_example_app_run_alone_explains_a_missing_configuration():
    """`python -m examples.partner_app`: `--help` needs no configuration, and a missing PARTNER_*
    setting is one line and exit 2, never a traceback."""
    import os
    import subprocess
    import sys
    from helpers.environment import ROOT
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARTNER_")}
    run = lambda *argv: subprocess.run([sys.executable, "-m", "examples.partner_app", *argv], env=env,  # noqa: E731
                                       cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    helped = run("--help")
    assert helped.returncode == 0 and "--port" in helped.stdout and "PARTNER_CLIENT_ID" in helped.stdout, helped.stderr
    refused = run()
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "client_id and client_secret are required" in refused.stderr and "PARTNER_" in refused.stderr


def test_the_example_app_run_alone_logs_no_launch_id_nor_code(tmp_path):
    """`python -m examples.partner_app` logged Tornado's default access line, the whole URI: every
    launch's `launch_id` and every authorization code (credentials until used) in its log. Their
    values are redacted, as in the service's own log; the path and the other parameters stay."""
    import os
    import urllib.request
    from helpers.http import NoRedirect
    from helpers.processes import free_port, start_process, stop_process, wait_until
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PARTNER_")},
           "PARTNER_CLIENT_ID": "example-client", "PARTNER_CLIENT_SECRET": "example-secret"}
    log = tmp_path / "partner.log"
    proc = start_process(["-m", "examples.partner_app", "--port", str(port)], env, port, log_path=log)
    opener = urllib.request.build_opener(NoRedirect)
    secrets = ("LAUNCHSECRET1", "LAUNCHSECRET2", "CODESECRET3", "STATESECRET4")
    try:
        for path in (f"/launch?launch_id={secrets[0]}&svc_organization_id=org-7&launch={secrets[1]}",
                     f"/app?code={secrets[2]}&state={secrets[3]}", f"/app?Launch%5FId={secrets[0]}"):
            try:
                opener.open(f"http://127.0.0.1:{port}{path}", timeout=30).close()
            except urllib.error.HTTPError:
                pass  # a 302 (not followed) or an error page: either is logged
        wait_until(lambda: log.read_text().count("(127.0.0.1)") >= 3, what="the three access lines")
    finally:
        stop_process(proc)
    text = log.read_text()
    assert "/launch?launch_id=[REDACTED]&svc_organization_id=org-7&launch=[REDACTED]" in text, text
    assert "/app?code=[REDACTED]&state=[REDACTED]" in text and "/app?Launch%5FId=[REDACTED]" in text, text
    assert not [secret for secret in secrets if secret in text], text
