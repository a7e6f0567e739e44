"""UserInfo returns only declared fields; introspection (RFC 7662) and platform verification."""
import pytest

from helpers.http import basic_auth
from models.application import Application, Authorization, Installation


@pytest.mark.gen_test
async def test_userinfo_returns_only_declared_fields(api, flow, world):
    Application.update(user_fields=["email"]).where(Application.id == world.app.id).execute()
    tokens = await flow.tokens()
    status, _, info = await api.call("GET", "/v1/oauth/userinfo", headers={"Authorization": f"Bearer {tokens['access_token']}"})
    assert status == 200 and info == {"sub": world.physician.id, "email": "doc@example.com"}


@pytest.mark.gen_test
async def test_userinfo_all_fields_under_claims_namespace(api, flow, world, runtime):
    tokens = await flow.tokens(prefix="/os-api/v2")
    status, _, info = await api.call("POST", "/os-api/v2/oauth/userinfo", headers={"Authorization": tokens["access_token"]})
    ns = runtime.settings.claims_namespace
    assert info == {"sub": world.physician.id, "email": "doc@example.com", "given_name": "Doc",
                    "family_name": "Tor", f"https://{ns}/ehrUsername": "dtor",
                    f"https://{ns}/organization": {"id": world.org.id, "name": "Test Clinic"}}


@pytest.mark.gen_test
async def test_userinfo_without_token_is_401(api):
    status, headers, body = await api.call("GET", "/v1/oauth/userinfo")
    assert status == 401 and body["error"] == "invalid_token" and "Bearer" in headers["WWW-Authenticate"]


@pytest.mark.gen_test
async def test_introspection_by_the_client_itself(api, flow, world):
    tokens = await flow.tokens()
    auth = {"Authorization": basic_auth(world.app.client_id, world.secret),
            "Content-Type": "application/x-www-form-urlencoded"}
    status, _, body = await api.call("POST", "/v1/oauth/introspect", body=f"token={tokens['access_token']}", headers=auth)
    assert status == 200 and body["active"] is True
    assert body["sub"] == world.physician.id and body["client_id"] == world.app.client_id
    # a client's introspection has no lifecycle side effects
    assert Installation.find(world.app.id, world.org.id).activation_status is None


@pytest.mark.gen_test
async def test_introspection_of_another_clients_token_is_inactive(api, flow, world, runtime):
    from lifecycle.applications import register_application
    other, secret = register_application(runtime, "Other", "https://o.example/cb", "https://o.example/l")
    tokens = await flow.tokens()
    status, _, body = await api.call("POST", "/v1/oauth/introspect", {"token": tokens["access_token"]},
                                     headers={"Authorization": basic_auth(other.client_id, secret)})
    assert status == 200 and body == {"active": False}


@pytest.mark.gen_test
async def test_platform_verification_records_authorization_and_disables_new_installation(api, flow, world):
    tokens = await flow.tokens()
    assert Installation.find(world.app.id, world.org.id).activation_status is None
    status, _, body = await api.call("POST", "/v1/oauth/introspect", {"token": tokens["access_token"]},
                                     headers={"Authorization": f"Bearer {world.sandbox_token}"})
    assert status == 200 and body["active"] is True
    assert Installation.find(world.app.id, world.org.id).activation_status == "Disabled"
    assert Authorization.select().where(Authorization.user == world.physician.id).count() == 1


@pytest.mark.gen_test
async def test_platform_cannot_verify_a_token_of_another_user(api, flow, world):
    tokens = await flow.tokens()  # issued for the physician
    status, _, body = await api.call("POST", "/v1/oauth/introspect", {"token": tokens["access_token"]},
                                     headers={"Authorization": f"Bearer {world.staff_sandbox_token}"})
    assert body == {"active": False}
    assert Authorization.select().count() == 0


@pytest.mark.gen_test
async def test_introspection_requires_caller_authentication(api, flow):
    tokens = await flow.tokens()
    status, _, body = await api.call("POST", "/v1/oauth/introspect", {"token": tokens["access_token"]})
    assert status == 401 and body["error"] == "invalid_client"


# -- a token every resource refuses is never introspected active (RFC 7662 2.2) ------------------

async def _introspect_as_client(api, world, token):
    return await api.call("POST", "/v1/oauth/introspect", {"token": token},
                          headers={"Authorization": basic_auth(world.app.client_id, world.secret)})


@pytest.mark.gen_test
async def test_introspection_of_a_token_whose_user_was_removed_is_inactive(api, flow, world, runtime):
    from hub.sandbox import issue_sandbox_token
    from lifecycle.users import create_user
    from models.directory import User
    leaver = create_user(world.org.id, "leaver@example.com", "Lea", "Ver", "lver")
    code = await flow.code(launch_id=await flow.launch(sandbox_token=issue_sandbox_token(runtime, leaver)))
    status, _, tokens = await flow.exchange(code)
    assert status == 200, tokens
    assert (await _introspect_as_client(api, world, tokens["access_token"]))[2]["active"] is True
    User.delete().where(User.id == leaver.id).execute()
    bearer = {"Authorization": f"Bearer {tokens['access_token']}"}
    assert (await api.call("GET", "/v1/oauth/userinfo", headers=bearer))[0] == 401
    status, _, body = await _introspect_as_client(api, world, tokens["access_token"])
    assert status == 200 and body == {"active": False}


@pytest.mark.gen_test
async def test_introspection_of_a_token_whose_installation_is_disabled_is_inactive(api, flow, world, runtime):
    from lifecycle.activation import set_activation_status
    from lifecycle.verification import record_platform_verification
    record_platform_verification(runtime, world.app, world.physician)  # the first launch: Disabled
    set_activation_status(runtime, Installation.find(world.app.id, world.org.id), "Enabled", "test")
    tokens = await flow.tokens()
    assert (await _introspect_as_client(api, world, tokens["access_token"]))[2]["active"] is True
    set_activation_status(runtime, Installation.find(world.app.id, world.org.id), "Disabled", "test")
    bearer = {"Authorization": f"Bearer {tokens['access_token']}"}
    status, _, body = await api.call("GET", "/v1/oauth/userinfo", headers=bearer)
    assert status == 403 and body["error"] == "application_disabled"
    status, _, body = await _introspect_as_client(api, world, tokens["access_token"])
    assert status == 200 and body == {"active": False}


@pytest.mark.gen_test
async def test_introspection_of_a_token_whose_installation_was_removed_is_inactive(api, flow, world):
    tokens = await flow.tokens()
    assert (await _introspect_as_client(api, world, tokens["access_token"]))[2]["active"] is True
    Installation.delete().where((Installation.application == world.app.id)
                                & (Installation.organization == world.org.id)).execute()
    bearer = {"Authorization": f"Bearer {tokens['access_token']}"}
    status, _, body = await api.call("GET", "/v1/oauth/userinfo", headers=bearer)
    assert status == 403 and body["error"] == "not_installed"
    status, _, body = await _introspect_as_client(api, world, tokens["access_token"])
    assert status == 200 and body == {"active": False}


def test_userinfo_needs_openid_in_the_tokens_scope_at_a_real_serve(live, runtime, world):
    """UserInfo is OpenID Connect's (OIDC Core 5.3): an access token without `openid` in its scope is
    403 `insufficient_scope` naming `openid`, as node-oidc-provider answers. Only a refresh narrowed
    away from it has none (authorize always grants it), and a token narrowed to a resource scope must
    not still tell who the user is (email, name, EHR username, clinic): narrowing is least privilege."""
    import json
    import urllib.parse
    from helpers.http import http
    from helpers.smart import launch_tokens
    from lifecycle.applications import set_smart_scopes
    from models.application import DEFAULT_SMART_SCOPES

    set_smart_scopes(runtime, world.app.id, DEFAULT_SMART_SCOPES + " offline_access")
    first = launch_tokens(live, runtime, world.physician, world.app, world.secret,
                          "launch openid fhirUser offline_access patient/*.rs")
    client = {"Authorization": basic_auth(world.app.client_id, world.secret),
              "Content-Type": "application/x-www-form-urlencoded"}

    def userinfo(token: str):
        status, headers, body = http("GET", f"{live}/v1/oauth/userinfo", headers={"Authorization": f"Bearer {token}"})
        return status, headers, json.loads(body)

    status, _, info = userinfo(first["access_token"])
    assert status == 200 and info["sub"] == world.physician.id and info["email"] == "doc@example.com", info
    status, _, body = http("POST", f"{live}/v1/oauth/token", urllib.parse.urlencode({
        "grant_type": "refresh_token", "refresh_token": first["refresh_token"],
        "scope": "patient/Patient.rs"}).encode(), client)
    narrowed = json.loads(body)
    assert status == 200 and narrowed["scope"] == "patient/Patient.rs", narrowed
    status, headers, info = userinfo(narrowed["access_token"])
    assert status == 403 and info["error"] == "insufficient_scope" and "email" not in info, info
    assert 'error="insufficient_scope"' in headers["WWW-Authenticate"]
    assert 'scope="openid"' in headers["WWW-Authenticate"], headers["WWW-Authenticate"]
    status, _, body = http("POST", f"{live}/v1/oauth/introspect",
                           f"token={narrowed['access_token']}".encode(), client)
    assert status == 200 and json.loads(body)["active"] is True  # the token itself is fine
    status, _, body = http("POST", f"{live}/v1/oauth/token", urllib.parse.urlencode({
        "grant_type": "refresh_token", "refresh_token": narrowed["refresh_token"]}).encode(), client)
    assert status == 200 and userinfo(json.loads(body)["access_token"])[0] == 200  # the grant keeps openid
