"""Forged and stale tokens are refused everywhere we verify tokens."""
import base64
import hashlib
import hmac
import json
import time

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jose import jwt

from hub.sandbox import issue_sandbox_token


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsigned(claims: dict, header: dict) -> str:
    return f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}."


def hs256(claims: dict, header: dict, secret: bytes) -> str:
    """The classic key-confusion forgery: HMAC keyed with the public key's PEM."""
    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
    return signing_input + "." + b64(hmac.new(secret, signing_input.encode(), hashlib.sha256).digest())


def forgeries(runtime, claims: dict, typ: str) -> dict:
    """The same claims, signed in every way an attacker might try."""
    key = runtime.keyring.active
    public_pem = key.verifier.to_pem().decode()
    foreign = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    expired = dict(claims, exp=int(time.time()) - 10)
    tampered = runtime.tokens.sign(claims, typ=typ).split(".")
    tampered[1] = b64(json.dumps(dict(claims, sub="usr_someone_else")).encode())
    return {
        "alg_none": unsigned(claims, {"alg": "none", "kid": key.kid, "typ": typ}),
        "hs256_with_public_key": hs256(claims, {"alg": "HS256", "kid": key.kid, "typ": typ}, public_pem.encode()),
        "foreign_key_same_kid": jwt.encode(claims, foreign.decode(), algorithm="RS256", headers={"kid": key.kid, "typ": typ}),
        "expired": runtime.tokens.sign(expired, typ=typ),
        "tampered_payload": ".".join(tampered),
        "garbage": "not.a.token",
    }


def stored_claims(runtime, token):
    return jwt.get_unverified_claims(token)


@pytest.mark.gen_test
async def test_forged_access_tokens_are_refused_at_userinfo_and_introspection(api, flow, runtime, world):
    tokens = await flow.tokens()
    claims = stored_claims(runtime, tokens["access_token"])
    assert (await api.call("GET", "/v1/oauth/userinfo", headers={"Authorization": tokens["access_token"]}))[0] == 200
    for name, forged in forgeries(runtime, claims, "at+jwt").items():
        status, headers, body = await api.call("GET", "/v1/oauth/userinfo", headers={"Authorization": f"Bearer {forged}"})
        assert status == 401, name
        assert 'Bearer error="invalid_token"' in headers["WWW-Authenticate"], name
        status, _, body = await api.call("POST", "/v1/oauth/introspect", {"token": forged},
                                         headers={"Authorization": f"Bearer {world.sandbox_token}"})
        assert status == 200 and body == {"active": False}, name


@pytest.mark.gen_test
async def test_id_token_is_not_accepted_as_access_token(api, flow):
    tokens = await flow.tokens()
    status, _, _ = await api.call("GET", "/v1/oauth/userinfo", headers={"Authorization": tokens["id_token"]})
    assert status == 401


@pytest.mark.gen_test
async def test_access_token_expires_after_five_minutes(api, flow, runtime):
    tokens = await flow.tokens()
    runtime.clock.advance(runtime.settings.access_token_ttl + 1)  # 300 s
    status, _, _ = await api.call("GET", "/v1/oauth/userinfo", headers={"Authorization": tokens["access_token"]})
    assert status == 401


@pytest.mark.gen_test
async def test_forged_sandbox_tokens_fail_with_authentication_failed(api, runtime, world):
    claims = stored_claims(runtime, world.sandbox_token)
    for name, forged in forgeries(runtime, claims, "at+jwt").items():
        status, _, body = await api.call("POST", "/v1/sandbox/launches", {"client_id": world.app.client_id},
                                         headers={"Authorization": f"Bearer {forged}"})
        assert (status, body) == (401, {"error": "invalid_token", "message": "Authentication failed"}), name


@pytest.mark.gen_test
async def test_sandbox_token_expires_after_thirty_minutes(api, runtime, world):
    token = issue_sandbox_token(runtime, world.physician)
    runtime.clock.advance(runtime.settings.sandbox_token_ttl - 60)  # 30 minutes
    assert (await api.call("POST", "/v1/sandbox/launches", {"client_id": world.app.client_id},
                           headers={"Authorization": f"Bearer {token}"}))[0] == 201
    runtime.clock.advance(61)
    status, _, body = await api.call("POST", "/v1/sandbox/launches", {"client_id": world.app.client_id},
                                     headers={"Authorization": f"Bearer {token}"})
    assert status == 401 and body["message"] == "Authentication failed"


@pytest.mark.gen_test
async def test_user_access_token_is_not_a_sandbox_token(api, flow, world):
    tokens = await flow.tokens()
    status, _, _ = await api.call("POST", "/v1/sandbox/launches", {"client_id": world.app.client_id},
                                  headers={"Authorization": f"Bearer {tokens['access_token']}"})
    assert status == 401
