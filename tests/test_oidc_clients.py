"""Metadata (RFC 8414, RFC 9207) and OIDC Core behaviour, asserted through two client libraries
against a real `svc-auth serve` process: `openid-client` (npm, tests/js/oidc_rp.mjs) and Authlib.

Where no interactive login exists: prompt=none without a usable launch is login_required;
auth_time is when the user authenticated with the platform (the sandbox token's auth_time,
copied onto each launch), the same across flows; max_age older than that is login_required;
`request`/`request_uri` are refused; a request of nothing grantable is invalid_scope; every authorization
response carries `iss`.
"""
import json
import secrets
import shutil
import subprocess
import time
import urllib.parse

import pytest

from helpers.environment import JS_DIR
from helpers.http import http
from helpers.tokens import as_service


@pytest.fixture(autouse=True)
def insecure_transport(monkeypatch):
    monkeypatch.setenv("AUTHLIB_INSECURE_TRANSPORT", "1")  # the test server (conftest `live`) speaks plain http


def sandbox_token(live, runtime, user, auth_time):
    """A sandbox token as the live service issues it (its issuer), signed in at `auth_time`."""
    from hub.sandbox import issue_sandbox_token
    as_live = as_service(runtime, live)
    return issue_sandbox_token(as_live, user, auth_time=auth_time)


def launch(live, world, token) -> str:
    status, _, body = http("POST", f"{live}/v1/sandbox/launches",
                           json.dumps({"client_id": world.app.client_id}).encode(),
                           {"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    assert status == 201, body
    return json.loads(body)["launch_id"]


def follow(url) -> str:
    status, headers, body = http("GET", url)
    assert status == 302, body
    return headers["Location"]


def rp(live, world, op, **extra):
    """One step of the openid-client relying party."""
    node = shutil.which("node")
    assert node and (JS_DIR / "node_modules" / "openid-client").exists(), "run `make test` (npm ci in tests/js)"
    payload = {"op": op, "issuer": live + "/", "client_id": world.app.client_id,
               "client_secret": world.secret, **extra}
    result = subprocess.run([node, str(JS_DIR / "oidc_rp.mjs"), json.dumps(payload)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def rp_authorize(live, world, **params):
    base = {"redirect_uri": world.app.redirect_uri, "scope": "openid"}
    return rp(live, world, "authorize_url", params={**base, **params})["url"]


def query_of(location) -> dict:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(location).query))


# -- metadata ---------------------------------------------------------------------------------

def test_metadata_rfc8414_and_openid_discovery(live, world):
    from authlib.oauth2 import rfc8414, rfc9207
    from authlib.oidc.discovery import OpenIDProviderMetadata
    oidc = json.loads(http("GET", f"{live}/.well-known/openid-configuration")[2])
    oauth = json.loads(http("GET", f"{live}/.well-known/oauth-authorization-server")[2])
    assert oauth == oidc and oidc["issuer"] == live + "/"
    OpenIDProviderMetadata(oidc).validate(metadata_classes=[rfc9207.AuthorizationServerMetadata])
    rfc8414.AuthorizationServerMetadata(oauth).validate(metadata_classes=[rfc9207.AuthorizationServerMetadata])
    assert oidc["authorization_response_iss_parameter_supported"] is True
    assert oidc["request_parameter_supported"] is False and oidc["request_uri_parameter_supported"] is False
    assert set(oidc["scopes_supported"]) >= {"openid", "email", "profile", "ehr_username", "organization"}
    namespace = urllib.parse.urlsplit(live).hostname
    assert {"sub", "auth_time", "email", f"https://{namespace}/ehrUsername"} <= set(oidc["claims_supported"])
    # openid-client finds the same document both ways (OIDC discovery, and RFC 8414 for OAuth 2.0)
    for algorithm in ("oidc", "oauth2"):
        meta = rp(live, world, "discover", algorithm=algorithm)
        assert meta["issuer"] == live + "/" and meta["authorization_response_iss_parameter_supported"] is True


# -- openid-client --------------------------------------------------------------------------

def test_auth_time_is_the_platform_sign_in_across_flows_openid_client(live, runtime, world):
    signed_in = int(time.time()) - 120
    token = sandbox_token(live, runtime, world.physician, signed_in)
    seen = []
    for _ in range(2):  # two flows of one platform session
        state, nonce = secrets.token_urlsafe(8), secrets.token_urlsafe(8)
        url = rp_authorize(live, world, scope="openid email profile", state=state, nonce=nonce, max_age="600",
                           launch_id=launch(live, world, token))
        location = follow(url)
        assert query_of(location)["iss"] == live + "/"  # RFC 9207
        # openid-client checks iss (the metadata says it is sent), state, nonce, and auth_time
        # against max_age, then fetches userinfo.
        result = rp(live, world, "callback", callback_url=location, userinfo=True,
                    checks={"expectedState": state, "expectedNonce": nonce, "maxAge": 600})
        assert "claims" in result, result
        assert result["claims"]["sub"] == world.physician.id and result["userinfo"]["email"] == "doc@example.com"
        assert result["scope"] == "openid email profile"
        seen.append(result["claims"]["auth_time"])
    assert seen == [signed_in, signed_in]


def test_openid_client_refuses_a_response_without_iss(live, runtime, world):
    token = sandbox_token(live, runtime, world.physician, int(time.time()))
    location = follow(rp_authorize(live, world, state="s1", launch_id=launch(live, world, token)))
    without_iss = location.replace("&iss=" + urllib.parse.quote(live + "/", safe=""), "")
    assert without_iss != location
    assert "refused" in rp(live, world, "callback", callback_url=without_iss, checks={"expectedState": "s1"})


@pytest.mark.parametrize("case", ["prompt_none_no_launch", "prompt_none_used_launch", "max_age_exceeded",
                                  "request", "request_uri", "unknown_scope", "prompt_login"])
def test_authorization_errors_openid_client(live, runtime, world, case):
    token = sandbox_token(live, runtime, world.physician, int(time.time()) - 3600)
    params = {"state": "st"}
    if case == "prompt_none_no_launch":
        params.update(prompt="none")
        expected = "login_required"
    elif case == "prompt_none_used_launch":
        launch_id = launch(live, world, token)
        follow(rp_authorize(live, world, launch_id=launch_id))  # uses it
        params.update(prompt="none", launch_id=launch_id)
        expected = "login_required"
    elif case == "max_age_exceeded":
        params.update(max_age="60", launch_id=launch(live, world, token))
        expected = "login_required"
    elif case == "request":
        params.update(request="eyJhbGciOiJub25lIn0.e30.", launch_id=launch(live, world, token))
        expected = "request_not_supported"
    elif case == "request_uri":
        params.update(request_uri="https://app.example.com/request.jwt", launch_id=launch(live, world, token))
        expected = "request_uri_not_supported"
    elif case == "unknown_scope":
        params.update(scope="admin", launch_id=launch(live, world, token))
        expected = "invalid_scope"
    else:
        params.update(prompt="login", launch_id=launch(live, world, token))
        expected = "login_required"
    location = follow(rp_authorize(live, world, **params))
    assert query_of(location)["iss"] == live + "/" and query_of(location)["state"] == "st"
    result = rp(live, world, "callback", callback_url=location, checks={"expectedState": "st"})
    assert result.get("error") == expected, result


def test_max_age_failure_leaves_the_launch_usable(live, runtime, world):
    token = sandbox_token(live, runtime, world.physician, int(time.time()) - 3600)
    launch_id = launch(live, world, token)
    assert query_of(follow(rp_authorize(live, world, max_age="60", launch_id=launch_id)))["error"] == "login_required"
    assert "code" in query_of(follow(rp_authorize(live, world, max_age="7200", launch_id=launch_id)))


# -- Authlib ------------------------------------------------------------------------------

def authlib_rp(live, world, scope="openid email"):
    """A relying party made with Authlib's Flask client: discovery, authorize redirect with a
    nonce, callback (error responses raise OAuthError), code exchange with client_secret_basic
    and ID token validation (signature via the JWKS, iss from the metadata, aud, nonce)."""
    from authlib.integrations.base_client.errors import OAuthError
    from authlib.integrations.flask_client import OAuth
    from flask import Flask, request
    app = Flask("authlib-rp")
    app.secret_key = secrets.token_hex(16)
    oauth = OAuth(app)
    oauth.register("svc", client_id=world.app.client_id, client_secret=world.secret,
                   server_metadata_url=f"{live}/.well-known/openid-configuration",
                   client_kwargs={"scope": scope, "token_endpoint_auth_method": "client_secret_basic"})

    @app.route("/login")
    def login():
        return oauth.svc.authorize_redirect(world.app.redirect_uri, **request.args.to_dict())

    @app.route("/main")
    def main():
        meta = oauth.svc.load_server_metadata()
        if request.args.get("iss") != meta["issuer"]:  # RFC 9207, as the metadata promises
            return {"refused": "iss"}
        try:
            token = oauth.svc.authorize_access_token()
        except OAuthError as err:
            return {"error": err.error}
        return {"claims": dict(token["userinfo"]), "scope": token["scope"],
                "userinfo": dict(oauth.svc.userinfo(token=token))}

    return app.test_client()


def authlib_run(client, **params):
    base = "https://app.example.com"
    response = client.get("/login", query_string=params, base_url=base)
    assert response.status_code == 302, response.data
    location = follow(response.headers["Location"])
    return client.get(location.removeprefix(base), base_url=base).get_json()


def test_authlib_flow_auth_time_and_userinfo(live, runtime, world):
    signed_in = int(time.time()) - 300
    token = sandbox_token(live, runtime, world.physician, signed_in)
    client = authlib_rp(live, world)
    for _ in range(2):
        result = authlib_run(client, launch_id=launch(live, world, token), max_age="900")
        assert "claims" in result, result
        assert result["claims"]["auth_time"] == signed_in and result["scope"] == "openid email"
        assert result["userinfo"]["sub"] == world.physician.id


@pytest.mark.parametrize("params,expected", [
    ({"prompt": "none"}, "login_required"),
    ({"scope": "admin", "with_launch": True}, "invalid_scope"),
    ({"max_age": "5", "with_launch": True}, "login_required"),
    ({"request": "eyJhbGciOiJub25lIn0.e30.", "with_launch": True}, "request_not_supported"),
    ({"request_uri": "https://app.example.com/r.jwt", "with_launch": True}, "request_uri_not_supported"),
])
def test_authlib_sees_the_oidc_errors(live, runtime, world, params, expected):
    params = dict(params)
    client = authlib_rp(live, world, scope=params.pop("scope", "openid"))
    if params.pop("with_launch", False):
        token = sandbox_token(live, runtime, world.physician, int(time.time()) - 3600)
        params["launch_id"] = launch(live, world, token)
    assert authlib_run(client, **params) == {"error": expected}


def test_client_credentials_scope(live, world):
    from authlib.integrations.requests_client import OAuth2Session
    from authlib.integrations.base_client.errors import OAuthError
    meta = json.loads(http("GET", f"{live}/.well-known/oauth-authorization-server")[2])
    session = OAuth2Session(world.app.client_id, world.secret, scope="partner_api")
    assert session.fetch_token(meta["token_endpoint"], grant_type="client_credentials")["scope"] == "partner_api"
    with pytest.raises(OAuthError) as err:
        OAuth2Session(world.app.client_id, world.secret, scope="admin").fetch_token(
            meta["token_endpoint"], grant_type="client_credentials")
    assert err.value.error == "invalid_scope"
