"""Standard clients work unchanged against a real `svc-auth serve` process.

- pyoidc (an OpenID Foundation certified relying-party library): discovery, authorization
  request, code exchange with client_secret_basic and a form body, ID token validation against
  the JWKS (signature, iss, aud, nonce), userinfo with Bearer.
- The ID token verifies with python-jose, PyJWT, jwcrypto and the `jose` npm package using
  nothing but the published JWKS, iss = SVC_ISSUER + "/", aud = client id.
"""
import json
import shutil
import subprocess
import urllib.parse
import urllib.request

import jwt as pyjwt
import pytest
from jose import jwt as jose_jwt
from jwcrypto import jwk as jwcrypto_jwk
from jwcrypto import jwt as jwcrypto_jwt
from helpers.environment import JS_DIR
from helpers.http import http
from helpers.tokens import token_service










def new_launch(issuer, runtime, world) -> str:
    # a sandbox token as that service (issuer = its own address) issues it
    token = token_service(runtime, issuer).access_token(
        world.physician.id, "sandbox", 1800)[0]
    status, _, body = http("POST", f"{issuer}/v1/sandbox/launches", json.dumps({"client_id": world.app.client_id}).encode(),
                           {"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    assert status == 201, body
    return json.loads(body)["launch_id"]


def test_certified_relying_party_library_completes_the_flow(live, runtime, world):
    from oic import rndstr
    from oic.oic import Client
    from oic.oic.message import AuthorizationResponse, RegistrationResponse
    from oic.utils.authn.client import CLIENT_AUTHN_METHOD

    app = world.app
    client = Client(client_authn_method=CLIENT_AUTHN_METHOD)
    client.provider_config(live + "/")
    assert client.provider_info["issuer"] == live + "/"
    client.store_registration_info(RegistrationResponse(
        client_id=app.client_id, client_secret=world.secret, redirect_uris=[app.redirect_uri],
        token_endpoint_auth_method="client_secret_basic"))
    state, nonce = rndstr(), rndstr()
    request = client.construct_AuthorizationRequest(request_args={
        "client_id": app.client_id, "response_type": "code", "scope": ["openid", "email"], "nonce": nonce,
        "redirect_uri": app.redirect_uri, "state": state, "launch_id": new_launch(live, runtime, world)})
    status, headers, _ = http("GET", request.request(client.authorization_endpoint))
    assert status == 302
    response = client.parse_response(AuthorizationResponse, info=urllib.parse.urlsplit(headers["Location"]).query,
                                     sformat="urlencoded")
    assert response["state"] == state
    tokens = client.do_access_token_request(state=state, request_args={"code": response["code"]},
                                            authn_method="client_secret_basic")
    id_token = tokens["id_token"]  # already validated by pyoidc: signature (JWKS), iss, aud, nonce
    assert id_token["sub"] == world.physician.id and id_token["nonce"] == nonce
    info = client.do_user_info_request(state=state, behavior="use_authorization_header")
    assert info["sub"] == world.physician.id and info["email"] == "doc@example.com"


def test_id_token_verifies_with_four_jwt_libraries_using_only_the_jwks(live, runtime, world):
    app = world.app
    launch_id = new_launch(live, runtime, world)
    query = urllib.parse.urlencode({"client_id": app.client_id, "redirect_uri": app.redirect_uri,
                                    "response_type": "code", "launch_id": launch_id})
    status, headers, _ = http("GET", f"{live}/v1/oauth/authorize?{query}")
    code = urllib.parse.parse_qs(urllib.parse.urlsplit(headers["Location"]).query)["code"][0]
    status, _, body = http("POST", f"{live}/v1/oauth/token", json.dumps({
        "grant_type": "authorization_code", "client_id": app.client_id, "client_secret": world.secret,
        "code": code}).encode(), {"Content-Type": "application/json"})
    id_token = json.loads(body)["id_token"]
    config = json.loads(http("GET", f"{live}/.well-known/openid-configuration")[2])
    jwks = json.loads(http("GET", config["jwks_uri"])[2])
    issuer = live + "/"
    kid = jose_jwt.get_unverified_header(id_token)["kid"]
    key = next(k for k in jwks["keys"] if k["kid"] == kid)

    verified = {
        "python-jose": jose_jwt.decode(id_token, jwks, algorithms=["RS256"], audience=app.client_id, issuer=issuer),
        "PyJWT": pyjwt.decode(id_token, pyjwt.PyJWK(key).key, algorithms=["RS256"], audience=app.client_id,
                              issuer=issuer),
    }
    token = jwcrypto_jwt.JWT(jwt=id_token, key=jwcrypto_jwk.JWKSet.from_json(json.dumps(jwks)),
                             algs=["RS256"], check_claims={"iss": issuer, "aud": app.client_id, "exp": None})
    verified["jwcrypto"] = json.loads(token.claims)
    node = shutil.which("node")
    assert node and (JS_DIR / "node_modules" / "jose").exists(), "run `make test` (installs the jose npm package)"
    result = subprocess.run([node, str(JS_DIR / "verify_id_token.mjs"), config["jwks_uri"], id_token, issuer,
                             app.client_id], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    verified["jose (npm)"] = json.loads(result.stdout)
    for library, claims in verified.items():
        assert claims["sub"] == world.physician.id, library
        assert claims["aud"] == app.client_id, library
    # and a token for another audience is refused by the same library
    with pytest.raises(pyjwt.InvalidAudienceError):
        pyjwt.decode(id_token, pyjwt.PyJWK(key).key, algorithms=["RS256"], audience="someone-else", issuer=issuer)
