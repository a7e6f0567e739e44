"""PKCE (RFC 7636) through HTTP: S256 binds the code, plain is refused, per-app requirement, discovery."""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.parse

import pytest

from helpers.environment import ROOT
from helpers.http import http
from helpers.processes import settings_env
from lifecycle.applications import install_application, register_application
from oauth.pkce import s256

VERIFIER = "v" * 20 + "-._~" + "0123456789abcdefghijklmnop"


def error_of(headers) -> dict:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(headers["Location"]).query))


@pytest.mark.gen_test
async def test_s256_binds_the_code(flow):
    challenge = s256(VERIFIER)
    code = await flow.code(code_challenge=challenge, code_challenge_method="S256")
    status, _, body = await flow.exchange(code, code_verifier="w" * 50)
    assert status == 400 and body["error"] == "invalid_grant" and "code_verifier" in body["error_description"]
    code = await flow.code(code_challenge=challenge, code_challenge_method="S256")
    status, _, body = await flow.exchange(code)  # no verifier at all
    assert status == 400 and body["error"] == "invalid_grant"
    code = await flow.code(code_challenge=challenge, code_challenge_method="S256")
    status, _, body = await flow.exchange(code, code_verifier=VERIFIER)
    assert status == 200, body


@pytest.mark.gen_test
async def test_a_verifier_for_a_code_without_challenge_is_refused(flow):
    status, _, body = await flow.exchange(await flow.code(), code_verifier=VERIFIER)
    assert status == 400 and body["error"] == "invalid_grant"


@pytest.mark.gen_test
@pytest.mark.parametrize("params", [
    {"code_challenge": VERIFIER, "code_challenge_method": "plain"},
    {"code_challenge": s256(VERIFIER)},                      # no method: RFC 7636 reads it as plain
    {"code_challenge_method": "S256"},                       # a method without a challenge
    {"code_challenge": "short", "code_challenge_method": "S256"},
])
async def test_plain_and_malformed_challenges_are_invalid_request(flow, params):
    status, headers, _ = await flow.authorize(state="st", **params)
    assert status == 302
    answer = error_of(headers)
    assert answer["error"] == "invalid_request" and answer["state"] == "st" and "code" not in answer


@pytest.mark.gen_test
async def test_require_pkce_per_app(flow, world, runtime):
    app, secret = register_application(runtime, "Strict", "https://strict.example/cb", "https://strict.example/l",
                                       require_pkce=True)
    install_application(app.id, world.org.id)
    launch_id = await flow.launch(client_id=app.client_id)
    query = {"client_id": app.client_id, "redirect_uri": "https://strict.example/cb", "response_type": "code",
             "launch_id": launch_id}
    status, headers, _ = await flow.api.call("GET", f"/v1/oauth/authorize?{urllib.parse.urlencode(query)}")
    assert status == 302 and error_of(headers)["error"] == "invalid_request"
    assert "PKCE" in error_of(headers)["error_description"]
    query.update(launch_id=await flow.launch(client_id=app.client_id), code_challenge=s256(VERIFIER),
                 code_challenge_method="S256")
    status, headers, _ = await flow.api.call("GET", f"/v1/oauth/authorize?{urllib.parse.urlencode(query)}")
    code = error_of(headers)["code"]
    status, _, body = await flow.api.call("POST", "/v1/oauth/token", {
        "grant_type": "authorization_code", "code": code, "client_id": app.client_id, "client_secret": secret,
        "code_verifier": VERIFIER})
    assert status == 200, body


@pytest.mark.gen_test
async def test_discovery_advertises_s256_only(api):
    for path in ("/.well-known/openid-configuration", "/.well-known/oauth-authorization-server"):
        status, _, body = await api.call("GET", path)
        if status == 404 and path.endswith("authorization-server"):
            continue  # RFC 8414 document is another branch's work
        assert status == 200 and body["code_challenge_methods_supported"] == ["S256"]


def test_cli_require_pkce(runtime, settings):
    out = subprocess.run([sys.executable, "-m", "cli.__main__", "apps", "create", "--name", "P", "--require-pkce",
                          "--redirect-uri", "https://p.example/cb", "--launch-url", "https://p.example/l", "--json"],
                         env=settings_env(settings), cwd=str(ROOT), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["require_pkce"] is True


def test_a_challenge_or_verifier_with_a_trailing_newline_is_refused_at_a_real_serve(live, runtime, world):
    """RFC 7636 4.2: a challenge is exactly 43 base64url characters. One with a final newline
    (`$` matches before it) used to be taken, binding the code to a challenge no verifier proves;
    it is invalid_request at authorize. A verifier with a final newline is refused as malformed."""
    from helpers.launch import authorize_at
    challenge = s256(VERIFIER)
    status, headers, _ = authorize_at(live, runtime, world.physician, world.app,
                                      code_challenge=challenge + "\n", code_challenge_method="S256")
    assert status == 302 and error_of(headers)["error"] == "invalid_request", headers.get("Location")
    assert "code" not in error_of(headers)
    status, headers, _ = authorize_at(live, runtime, world.physician, world.app,
                                      code_challenge=challenge, code_challenge_method="S256")
    code = error_of(headers)["code"]
    status, _, body = http("POST", f"{live}/v1/oauth/token", json.dumps({
        "grant_type": "authorization_code", "client_id": world.app.client_id, "client_secret": world.secret,
        "code": code, "code_verifier": VERIFIER + "\n"}).encode(), {"Content-Type": "application/json"})
    assert status == 400 and json.loads(body)["error"] == "invalid_grant"
    assert "43 to 128 characters" in json.loads(body)["error_description"], body
