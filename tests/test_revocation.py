"""RFC 7009 revocation, RFC 6750 challenges, introspection of client tokens, CORS on public metadata."""
from __future__ import annotations

import urllib.parse

import pytest

from helpers.http import basic_auth
from helpers.rest import partner_headers
from lifecycle.applications import register_application


def form(**fields) -> str:
    return urllib.parse.urlencode(fields)


FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.mark.gen_test
@pytest.mark.parametrize("prefix", ["/v1", "/os-api/v2"])
async def test_a_client_revokes_its_own_user_token(api, flow, world, prefix):
    app, secret = world.app, world.secret
    tokens = await flow.tokens(prefix)
    bearer = {"Authorization": f"Bearer {tokens['access_token']}"}
    assert (await api.call("GET", f"{prefix}/oauth/userinfo", headers=bearer))[0] == 200
    status, headers, body = await api.call("POST", f"{prefix}/oauth/revoke", body=form(token=tokens["access_token"]),
                                           headers={**FORM, "Authorization": basic_auth(app.client_id, secret)})
    assert status == 200 and headers["Cache-Control"] == "no-store"
    status, headers, _ = await api.call("GET", f"{prefix}/oauth/userinfo", headers=bearer)
    assert status == 401 and 'error="invalid_token"' in headers["WWW-Authenticate"]
    status, _, body = await api.call("POST", f"{prefix}/oauth/introspect", body=form(
        token=tokens["access_token"], client_id=app.client_id, client_secret=secret), headers=FORM)
    assert status == 200 and body == {"active": False}


@pytest.mark.gen_test
async def test_another_client_cannot_revoke(api, flow, world, runtime):
    tokens = await flow.tokens()
    other, other_secret = register_application(runtime, "Other", "https://o.example/cb", "https://o.example/l")
    status, _, _ = await api.call("POST", "/v1/oauth/revoke", body=form(
        token=tokens["access_token"], client_id=other.client_id, client_secret=other_secret), headers=FORM)
    assert status == 200  # RFC 7009 2.2: the same answer, nothing revoked
    bearer = {"Authorization": f"Bearer {tokens['access_token']}"}
    assert (await api.call("GET", "/v1/oauth/userinfo", headers=bearer))[0] == 200
    # Without client authentication nothing is revoked either.
    status, _, body = await api.call("POST", "/v1/oauth/revoke", body=form(token=tokens["access_token"]),
                                     headers=FORM)
    assert status == 401 and body["error"] == "invalid_client"
    status, _, body = await api.call("POST", "/v1/oauth/revoke", body=form(
        token=tokens["access_token"], client_id=other.client_id, client_secret="wrong"), headers=FORM)
    assert status == 401
    assert (await api.call("GET", "/v1/oauth/userinfo", headers=bearer))[0] == 200
    # Garbage tokens answer 200 too; a missing token parameter is a 400.
    status, _, _ = await api.call("POST", "/v1/oauth/revoke", body=form(
        token="garbage", client_id=other.client_id, client_secret=other_secret), headers=FORM)
    assert status == 200
    status, _, body = await api.call("POST", "/v1/oauth/revoke", body=form(
        client_id=other.client_id, client_secret=other_secret), headers=FORM)
    assert status == 400 and body["error"] == "invalid_request"


@pytest.mark.gen_test
async def test_revoked_client_token_fails_at_the_rest_api_and_introspection(api, world):
    app, secret = world.app, world.secret
    headers = await partner_headers(api, app, secret)
    token = headers["Authorization"].split()[1]
    path = f"/v1/applications/{app.id}/organizations"
    assert (await api.call("GET", path, headers=headers))[0] == 200
    # Introspecting its own client-credentials token: active.
    status, _, body = await api.call("POST", "/v1/oauth/introspect", body=form(
        token=token, client_id=app.client_id, client_secret=secret), headers=FORM)
    assert status == 200 and body["active"] is True and body["client_id"] == app.client_id
    status, _, _ = await api.call("POST", "/v1/oauth/revoke", body=form(
        token=token, token_type_hint="access_token", client_id=app.client_id, client_secret=secret), headers=FORM)
    assert status == 200
    status, resp_headers, body = await api.call("GET", path, headers=headers)
    assert status == 401 and body["error"] == "invalid_token"
    status, _, body = await api.call("POST", "/v1/oauth/introspect", body=form(
        token=token, client_id=app.client_id, client_secret=secret), headers=FORM)
    assert body == {"active": False}


@pytest.mark.gen_test
async def test_another_clients_client_token_is_not_introspectable(api, world, runtime):
    headers = await partner_headers(api, world.app, world.secret)
    other, other_secret = register_application(runtime, "Other", "https://o.example/cb", "https://o.example/l")
    status, _, body = await api.call("POST", "/v1/oauth/introspect", body=form(
        token=headers["Authorization"].split()[1], client_id=other.client_id, client_secret=other_secret),
        headers=FORM)
    assert status == 200 and body == {"active": False}


@pytest.mark.gen_test
async def test_no_error_code_in_the_challenge_when_no_token_was_sent(api, world):
    for path in ("/v1/oauth/userinfo", "/os-api/v2/oauth/userinfo", f"/v1/applications/{world.app.id}/organizations"):
        status, headers, _ = await api.call("GET", path)
        assert status == 401
        assert headers["WWW-Authenticate"].startswith("Bearer") and "error=" not in headers["WWW-Authenticate"]
        status, headers, _ = await api.call("GET", path, headers={"Authorization": "Bearer nope"})
        assert status == 401 and 'error="invalid_token"' in headers["WWW-Authenticate"]


@pytest.mark.gen_test
async def test_discovery_advertises_revocation_and_is_readable_cross_origin(api):
    for path in ("/.well-known/openid-configuration", "/.well-known/jwks.json"):
        status, headers, body = await api.call("GET", path, headers={"Origin": "https://spa.example"})
        assert status == 200 and headers["Access-Control-Allow-Origin"] == "*"
    _, _, body = await api.call("GET", "/.well-known/openid-configuration")
    assert body["revocation_endpoint"].endswith("/v1/oauth/revoke")
    status, headers, _ = await api.call("POST", "/.well-known/jwks.json", body="")
    assert status == 405 and "Access-Control-Allow-Origin" not in headers
