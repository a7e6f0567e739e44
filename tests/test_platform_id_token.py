"""The platform, and only the platform, learns the ID token issued with an access token: its
verification (introspection with the sandbox token of the same user) returns it, for an active token."""
from __future__ import annotations

import pytest

from helpers.http import basic_auth


@pytest.mark.gen_test
async def test_platform_verification_returns_the_id_token_issued_with_the_access_token(api, flow, world):
    tokens = await flow.tokens()
    status, _, body = await api.call("POST", "/v1/oauth/introspect", {"token": tokens["access_token"]},
                                     headers={"Authorization": f"Bearer {world.sandbox_token}"})
    assert status == 200 and body["active"] and body["id_token"] == tokens["id_token"]


@pytest.mark.gen_test
async def test_nobody_else_learns_it(api, flow, world):
    tokens = await flow.tokens()
    # The client itself (it has the ID token already): plain RFC 7662.
    status, _, body = await api.call("POST", "/v1/oauth/introspect", body=f"token={tokens['access_token']}",
                                     headers={"Authorization": basic_auth(world.app.client_id, world.secret),
                                              "Content-Type": "application/x-www-form-urlencoded"})
    assert status == 200 and body["active"] and "id_token" not in body
    # The platform on behalf of another user: not verified, nothing learnt.
    status, _, body = await api.call("POST", "/v1/oauth/introspect", {"token": tokens["access_token"]},
                                     headers={"Authorization": f"Bearer {world.staff_sandbox_token}"})
    assert status == 200 and body == {"active": False}
    # A revoked token (its code replayed): not active, nothing learnt.
    code = await flow.code()
    status, _, issued = await flow.exchange(code)
    assert status == 200
    await flow.exchange(code)
    status, _, body = await api.call("POST", "/v1/oauth/introspect", {"token": issued["access_token"]},
                                     headers={"Authorization": f"Bearer {world.sandbox_token}"})
    assert status == 200 and body == {"active": False}


@pytest.mark.gen_test
async def test_the_id_token_travels_sealed_in_the_access_token(api, flow, runtime):
    """Nothing is stored: the access token carries the ID token sealed under the server key."""
    from jose import jwt
    tokens = await flow.tokens()
    claims = jwt.get_unverified_claims(tokens["access_token"])
    sealed = claims["svc_idt"]
    assert tokens["id_token"] not in sealed and "." not in sealed
    assert runtime.hasher.unseal(sealed, claims["jti"]) == tokens["id_token"]
    assert runtime.hasher.unseal(sealed, "another-jti") is None
