"""POST /oauth/token: code rules, client authentication, secret rotation, malformed input."""
import threading
import urllib.parse

import pytest

from helpers.http import basic_auth
from lifecycle.applications import register_application
from oauth.secret_rotation import activate_fallback_secret, generate_fallback_secret
from models.grants import AuthorizationCode
from oauth.authorization_code import AuthorizationCodeGrant
from oauth.errors import OAuthError


@pytest.mark.gen_test
async def test_success_response_shape_and_no_store(flow):
    status, headers, body = await flow.exchange(await flow.code())
    assert status == 200
    assert set(body) >= {"access_token", "id_token", "token_type", "expires_in"}
    assert body["token_type"] == "Bearer"
    assert headers["Cache-Control"] == "no-store"


@pytest.mark.gen_test
async def test_code_replay_fails_and_revokes_first_tokens(api, flow):
    code = await flow.code()
    status, _, first = await flow.exchange(code)
    assert status == 200
    auth = {"Authorization": f"Bearer {first['access_token']}"}
    assert (await api.call("GET", "/v1/oauth/userinfo", headers=auth))[0] == 200
    status, _, body = await flow.exchange(code)
    assert status == 400 and body["error"] == "invalid_grant"
    status, headers, _ = await api.call("GET", "/v1/oauth/userinfo", headers=auth)
    assert status == 401 and 'error="invalid_token"' in headers["WWW-Authenticate"]


@pytest.mark.gen_test
async def test_code_expires_after_sixty_seconds(flow, runtime):
    code = await flow.code()
    runtime.clock.advance(runtime.settings.code_ttl + 1)  # 60 s
    status, _, body = await flow.exchange(code)
    assert status == 400 and body["error"] == "invalid_grant"


@pytest.mark.gen_test
async def test_code_is_bound_to_its_client(flow, runtime):
    code = await flow.code()
    other, secret = register_application(runtime, "Other", "https://other.example/cb", "https://other.example/l")
    status, _, body = await flow.api.call("POST", "/v1/oauth/token", {
        "grant_type": "authorization_code", "client_id": other.client_id, "client_secret": secret, "code": code})
    assert status == 400 and body["error"] == "invalid_grant"
    assert (await flow.exchange(code))[0] == 200  # the other client's attempt did not burn it


@pytest.mark.gen_test
async def test_code_is_bound_to_its_redirect_uri(flow, world):
    code = await flow.code(redirect_uri="https://app.example.com/main/a")
    status, _, body = await flow.exchange(code, redirect_uri="https://app.example.com/main/b")
    assert status == 400 and body["error"] == "invalid_grant"
    code = await flow.code(redirect_uri="https://app.example.com/main/a")
    assert (await flow.exchange(code, redirect_uri="https://app.example.com/main/a"))[0] == 200


@pytest.mark.gen_test
async def test_a_code_without_pkce_is_void_once_its_app_is_made_public(api, flow, world, runtime):
    """A confidential client's code issued without PKCE is bound by the client's secret alone. Once
    the app is a public client its backend can no longer present that secret, so the code would
    be exchanged by whoever names the public client_id: it is void instead (a public client's
    codes always carry a PKCE challenge)."""
    from lifecycle.applications import set_public
    code = await flow.code()
    set_public(runtime, world.app.id, True)
    status, _, body = await api.call("POST", "/v1/oauth/token", body=urllib.parse.urlencode(
        {"grant_type": "authorization_code", "code": code, "client_id": world.app.client_id}),
        headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 400 and body["error"] == "invalid_grant", body


@pytest.mark.gen_test
async def test_wrong_secret_is_401_invalid_client(flow):
    status, _, body = await flow.exchange(await flow.code(), secret="wrong")
    assert status == 401 and body["error"] == "invalid_client"


@pytest.mark.gen_test
async def test_form_body_with_http_basic(api, flow, world):
    code = await flow.code()
    status, headers, body = await api.call(
        "POST", "/v1/oauth/token", body=urllib.parse.urlencode({"grant_type": "authorization_code", "code": code}),
        headers={"Content-Type": "application/x-www-form-urlencoded",
                 "Authorization": basic_auth(world.app.client_id, world.secret)})
    assert status == 200 and body["id_token"]


@pytest.mark.gen_test
async def test_wrong_basic_secret_gets_basic_challenge(api, flow, world):
    status, headers, body = await api.call(
        "POST", "/v1/oauth/token", body="grant_type=authorization_code&code=x",
        headers={"Content-Type": "application/x-www-form-urlencoded",
                 "Authorization": basic_auth(world.app.client_id, "nope")})
    assert status == 401 and body["error"] == "invalid_client"
    assert headers["WWW-Authenticate"].startswith("Basic")


@pytest.mark.gen_test
async def test_two_client_authentication_methods_are_refused(api, flow, world):
    status, _, body = await api.call(
        "POST", "/v1/oauth/token", {"grant_type": "authorization_code", "code": await flow.code(),
                                    "client_secret": world.secret},
        headers={"Authorization": basic_auth(world.app.client_id, world.secret)})
    assert status == 400 and body["error"] == "invalid_request"


@pytest.mark.gen_test
async def test_fallback_secret_is_invalid_until_activated(flow, runtime, world):
    app_id = world.app.id
    fallback = generate_fallback_secret(runtime, app_id)
    status, _, body = await flow.exchange(await flow.code(), secret=fallback)
    assert status == 401 and body["error"] == "invalid_client"
    assert (await flow.exchange(await flow.code()))[0] == 200  # current secret still works
    activate_fallback_secret(runtime, app_id)
    assert (await flow.exchange(await flow.code(), secret=world.secret))[0] == 401
    assert (await flow.exchange(await flow.code(), secret=fallback))[0] == 200


@pytest.mark.gen_test
async def test_client_credentials_only_at_v1(api, world):
    auth = {"Authorization": basic_auth(world.app.client_id, world.secret),
            "Content-Type": "application/x-www-form-urlencoded"}
    status, _, body = await api.call("POST", "/v1/oauth/token", body="grant_type=client_credentials", headers=auth)
    assert status == 200 and body["token_type"] == "Bearer" and "id_token" not in body
    status, _, body = await api.call("POST", "/os-api/v2/oauth/token", body="grant_type=client_credentials",
                                     headers=auth)
    assert status == 400 and body["error"] == "unsupported_grant_type"


MALFORMED = [
    ({"Content-Type": "application/json"}, b"{not json", 400, "invalid_request"),
    ({"Content-Type": "application/json"}, b"[1, 2]", 400, "invalid_request"),
    ({"Content-Type": "application/json"}, b"\xff\xfe\x00garbage", 400, "invalid_request"),
    ({"Content-Type": "application/json"}, b'{"grant_type": 5}', 400, "invalid_request"),
    ({"Content-Type": "application/json"}, b'{"grant_type": "password"}', 400, "unsupported_grant_type"),
    ({"Content-Type": "application/json"}, b"{}", 400, "invalid_request"),
    ({"Content-Type": "text/plain"}, b"grant_type=authorization_code", 415, "invalid_request"),
    ({"Content-Type": "application/x-www-form-urlencoded"}, b"grant_type=a&grant_type=b", 400, "invalid_request"),
    ({"Content-Type": "application/json"}, b'{"grant_type": "authorization_code", "client_id": ["x"], '
                                           b'"client_secret": "y", "code": "z"}', 400, "invalid_request"),
    ({"Content-Type": "application/json"}, b'{"grant_type": "authorization_code", "client_id": "x", '
                                           b'"client_secret": "y"}', 401, "invalid_client"),
    ({"Content-Type": "application/json"}, b"{" + b'"a":' * 0 + b'"x": "' + b"y" * 70000 + b'"}', 413,
     "request_too_large"),
]


@pytest.mark.gen_test
@pytest.mark.parametrize("case", MALFORMED)
async def test_malformed_token_requests_get_clear_4xx(api, case):
    headers, body, status, error = case
    got, _, payload = await api.call("POST", "/v1/oauth/token", body=body, headers=headers)
    assert (got, payload["error"]) == (status, error)
    assert payload["message"]


@pytest.mark.gen_test
async def test_missing_code_with_valid_client(flow, world):
    status, _, body = await flow.api.call("POST", "/v1/oauth/token", {
        "grant_type": "authorization_code", "client_id": world.app.client_id, "client_secret": world.secret})
    assert status == 400 and body["error"] == "invalid_request"


@pytest.mark.gen_test
async def test_concurrent_exchanges_of_one_code_exactly_one_wins(flow, runtime, world):
    """Threads with their own database connections race on one code: the UPDATE decides."""
    code = await flow.code()
    app = world.app
    grant = AuthorizationCodeGrant(runtime)
    barrier = threading.Barrier(4)
    outcomes = []

    def attempt():
        barrier.wait()
        try:
            outcomes.append(("ok", grant.exchange(app, {"code": code}, with_billing=True)))
        except OAuthError as err:
            outcomes.append((err.error, None))
        finally:
            runtime.db.close()

    threads = [threading.Thread(target=attempt) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(o[0] for o in outcomes) == ["invalid_grant"] * 3 + ["ok"]
    assert AuthorizationCode.get(AuthorizationCode.code_hash == runtime.hasher.digest(code)).used_at is not None
