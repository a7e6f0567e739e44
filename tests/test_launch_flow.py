"""The whole launch over HTTP: sandbox launch -> authorize -> token -> userinfo, on both variants."""
import urllib.parse

import pytest
from jose import jwt


@pytest.mark.gen_test
async def test_launch_authorize_token_userinfo(api, flow, world):
    tokens = await flow.tokens()
    assert tokens["token_type"] == "Bearer" and tokens["expires_in"] == api.runtime.settings.access_token_ttl
    claims = jwt.get_unverified_claims(tokens["id_token"])
    assert claims["sub"] == world.physician.id
    assert claims["aud"] == world.app.client_id
    assert claims["iss"] == "http://127.0.0.1:8888/"
    status, _, info = await api.call("GET", "/v1/oauth/userinfo",
                                      headers={"Authorization": tokens["access_token"]})
    assert status == 200
    assert info["sub"] == world.physician.id
    assert info["email"] == "doc@example.com"
    assert info["https://127.0.0.1/organization"] == {"id": world.org.id, "name": "Test Clinic"}


@pytest.mark.gen_test
async def test_v2_id_token_has_no_billing_claims(flow):
    tokens = await flow.tokens(prefix="/os-api/v2")
    claims = jwt.get_unverified_claims(tokens["id_token"])
    assert "is_free_trial" not in claims and "application_billing_plan" not in claims
    v1 = jwt.get_unverified_claims((await flow.tokens())["id_token"])
    assert v1["application_billing_plan"] == "free_trial" and v1["is_free_trial"] is True


@pytest.mark.gen_test
async def test_state_is_passed_back(flow):
    status, headers, _ = await flow.authorize(state="xyz 1")
    assert status == 302
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(headers["Location"]).query)
    assert query["state"] == ["xyz 1"] and "code" in query
