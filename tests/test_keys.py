"""Signing keys: RFC 7638 kid, rotation with overlap, shared across processes."""
from types import SimpleNamespace

import pytest
from jose import jwt
from jwcrypto import jwk as jwcrypto_jwk

from keys.signing import KeyRing
from oauth.tokens import TokenService, InvalidToken


def test_kid_is_the_rfc7638_thumbprint(tmp_path):
    ring = KeyRing(str(tmp_path), retain_seconds=3600)
    published = ring.jwks()["keys"][0]
    assert published["kid"] == jwcrypto_jwk.JWK(**{k: published[k] for k in ("kty", "n", "e")}).thumbprint()


def test_first_start_generates_one_key_shared_by_every_process(tmp_path):
    first, second = KeyRing(str(tmp_path), 3600), KeyRing(str(tmp_path), 3600)
    assert first.active.kid == second.active.kid
    assert len(list(tmp_path.glob("rsa-*.pem"))) == 1
    assert oct(next(tmp_path.glob("rsa-*.pem")).stat().st_mode & 0o777) == "0o600"


def test_rotation_keeps_old_key_published_until_its_tokens_expire(tmp_path):
    now = [1_000_000.0]
    ring = KeyRing(str(tmp_path), retain_seconds=3600, clock=lambda: now[0])
    tokens = TokenService(ring, "https://issuer/", SimpleNamespace(time=lambda: now[0]))
    old_kid = ring.active.kid
    old_token, _ = tokens.access_token("usr_1", "platform", 10**9)
    now[0] += 10
    new = ring.rotate()
    assert new.kid != old_kid and ring.active.kid == new.kid
    assert [k["kid"] for k in ring.jwks()["keys"]] == [new.kid, old_kid]
    assert jwt.get_unverified_header(tokens.sign({"a": 1}))["kid"] == new.kid
    assert tokens.verify(old_token, "platform")["sub"] == "usr_1"
    now[0] += 3601
    assert [k["kid"] for k in ring.jwks()["keys"]] == [new.kid]
    with pytest.raises(InvalidToken):
        tokens.verify(old_token, "platform")


def test_other_processes_pick_up_a_rotation(tmp_path):
    ring_a, ring_b = KeyRing(str(tmp_path), 3600), KeyRing(str(tmp_path), 3600)
    ring_b.RECHECK_SECONDS = 0
    rotated = ring_a.rotate()
    assert ring_b.active.kid == rotated.kid


@pytest.mark.gen_test
async def test_jwks_and_discovery_over_http(api, runtime):
    status, headers, jwks = await api.call("GET", "/.well-known/jwks.json")
    assert status == 200 and jwks["keys"][0]["kid"] == runtime.keyring.active.kid
    assert set(jwks["keys"][0]) == {"kty", "use", "alg", "kid", "n", "e"}  # never private members
    status, _, config = await api.call("GET", "/.well-known/openid-configuration")
    assert config["issuer"] == "http://127.0.0.1:8888/"
    assert config["id_token_signing_alg_values_supported"] == ["RS256"]
    assert config["token_endpoint"] == "http://127.0.0.1:8888/v1/oauth/token"
    assert config["jwks_uri"] == "http://127.0.0.1:8888/.well-known/jwks.json"
    assert set(config["token_endpoint_auth_methods_supported"]) == {"client_secret_basic", "client_secret_post"}
