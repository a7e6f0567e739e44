"""SMART Backend Services over HTTP: a partner's pbackend registers its keys (a JWKS URL served by a
tiny HTTP server here, or a stored JWKS), signs client assertions with PyJWT, gets system tokens
from `client_credentials`, and reads and searches the FHIR API of the clinics where it is installed
and Enabled. Every rule of RFC 7523 and SMART is tried by a request that breaks it."""
from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
import uuid

import jwt
import pytest

from errors import ApiError
from helpers.backend import ASSERTION_TYPE, JwksHost, KeyPair, assertion, jwks, token_form, unsigned_style
from helpers.worlds import SMART_PATIENT, clinic
from lifecycle.applications import install_application, register_application
from lifecycle.backend_apps import set_backend_keys, set_system_scopes
from models.application import Installation
from models.disclosures import DisclosureRecord
from oauth.client_jwks import CACHE_SECONDS, RECHECK_INTERVAL

AUD = "http://127.0.0.1:8888/v1/oauth/token"
SCOPES = "system/Patient.rs system/Observation.rs system/Condition.read"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


class Backend:
    """A pbackend app with an RS384 and an ES384 key at a JWKS URL, installed in `world.org`."""

    def __init__(self, runtime, world, host: JwksHost, rsa: KeyPair, ec: KeyPair):
        self.rsa, self.ec, self.host, self.clock = rsa, ec, host, runtime.clock
        self.app, self.secret = register_application(runtime, "Analytics", "https://analytics.example/cb",
                                                     "https://analytics.example/launch")
        self.app = set_backend_keys(runtime, self.app.id, jwks_url=host.url)
        self.app = set_system_scopes(runtime, self.app.id, SCOPES)
        self.installation = install_application(self.app.id, world.org.id)
        self.client_id = self.app.client_id

    def assertion(self, pair=None, **kwargs) -> str:
        kwargs.setdefault("now", self.clock.time())  # the service's clock, which a test may move
        return assertion(pair or self.rsa, self.client_id, kwargs.pop("aud", AUD), **kwargs)


@pytest.fixture(scope="module")
def key_pairs():
    return KeyPair("RS384"), KeyPair("ES384")


@pytest.fixture
def pbackend(runtime, world, key_pairs):
    rsa, ec = key_pairs
    host = JwksHost(jwks(rsa, ec))
    yield Backend(runtime, world, host, rsa, ec)
    host.close()


async def token(api, form: dict, headers: dict | None = None):
    return await api.call("POST", "/v1/oauth/token", body=urllib.parse.urlencode(form),
                          headers={**FORM, **(headers or {})})


async def enable(api, pbackend, org_id):
    """The partner enables its app in the clinic with the partner API (its secret-based token)."""
    status, _, body = await api.call("POST", "/v1/oauth/token", {
        "grant_type": "client_credentials", "client_id": pbackend.client_id, "client_secret": pbackend.secret})
    assert status == 200, body
    status, _, body = await api.call(
        "PUT", f"/v1/applications/{pbackend.app.id}/organizations/{org_id}/activation-status", {"status": "Enabled"},
        headers={"Authorization": f"Bearer {body['access_token']}"})
    assert status == 200 and body["status"] == "Enabled", body


async def system_token(api, pbackend, scope=SCOPES, pair=None) -> dict:
    status, headers, body = await token(api, token_form(pbackend.assertion(pair), scope))
    assert status == 200, body
    assert headers["Cache-Control"] == "no-store"
    return body


async def fhir(api, org_id, path, access_token):
    return await api.call("GET", f"/fhir/r4/{org_id}{path}",
                          headers={"Authorization": f"Bearer {access_token}", "Accept": "application/fhir+json"})


# -- the token -----------------------------------------------------------------------------------

@pytest.mark.gen_test
async def test_rs384_and_es384_assertions_get_a_read_only_system_token(api, pbackend):
    body = await system_token(api, pbackend, "system/Patient.rs system/Observation.cruds system/Condition.*")
    assert set(body) == {"access_token", "token_type", "expires_in", "scope"}
    assert body["token_type"] == "bearer" and 0 < body["expires_in"] <= 300
    assert body["scope"] == "system/Patient.rs system/Observation.rs system/Condition.read"
    body = await system_token(api, pbackend, "system/Patient.read", pair=pbackend.ec)
    assert body["scope"] == "system/Patient.read"


@pytest.mark.gen_test
async def test_scopes_outside_the_registration_are_dropped(api, pbackend):
    body = await system_token(api, pbackend, "system/Patient.rs system/Encounter.rs patient/Observation.rs "
                                            "user/Patient.rs system/Observation.cud system/Nope.rs system/Patient.x "
                                            "openid launch")
    assert body["scope"] == "system/Patient.rs"
    body = await system_token(api, pbackend, "system/*.rs")  # narrowed to what is registered
    assert set(body["scope"].split()) == {"system/Patient.rs", "system/Observation.rs", "system/Condition.rs"}


@pytest.mark.gen_test
async def test_missing_or_ungrantable_scope_is_invalid_scope_and_the_assertion_can_be_sent_again(api, pbackend):
    signed = pbackend.assertion()
    for scope in (None, "", "system/Observation.write", "patient/Patient.rs", "system/Encounter.rs"):
        status, _, body = await token(api, token_form(signed, scope))
        assert status == 400 and body["error"] == "invalid_scope", (scope, body)
    status, _, body = await token(api, token_form(signed, "system/Patient.rs"))
    assert status == 200 and body["scope"] == "system/Patient.rs", body  # nothing was spent before
    status, _, body = await token(api, token_form(signed, "system/Patient.rs"))
    assert status == 401 and body["error"] == "invalid_client" and "already used" in body["error_description"]


@pytest.mark.gen_test
async def test_every_broken_rule_is_invalid_client(api, pbackend):
    other = KeyPair("RS384", kid=pbackend.rsa.kid)  # the right kid, another key: a bad signature
    fresh = {"iss": pbackend.client_id, "sub": pbackend.client_id, "aud": AUD, "exp": int(time.time()) + 60,
             "jti": uuid.uuid4().hex}
    cases = {
        "bad signature": assertion(other, pbackend.client_id, AUD),
        "unknown kid": pbackend.assertion(headers={"kid": "not-registered"}),
        "wrong aud": pbackend.assertion(aud="https://elsewhere.example/token"),
        "wrong jku": pbackend.assertion(headers={"jku": "https://evil.example/jwks.json"}),
        "expired": pbackend.assertion(exp_in=-10),
        "exp more than 5 minutes ahead": pbackend.assertion(exp_in=400),
        "no exp": jwt.encode({"iss": pbackend.client_id, "sub": pbackend.client_id, "aud": AUD, "jti": "x1"},
                             pbackend.rsa.private, algorithm="RS384", headers={"kid": pbackend.rsa.kid}),
        "sub is not the client": pbackend.assertion(sub="someone-else"),
        "RS256": pbackend.assertion(alg="RS256"),
        "HS256 with the public key's bytes": unsigned_style(fresh, {"kid": pbackend.rsa.kid}, "HS256",
                                                            json.dumps(pbackend.rsa.public_jwk).encode()),
        "alg none": unsigned_style(fresh, {"kid": pbackend.rsa.kid}, "none"),
        "ES384 signature under the RSA kid": assertion(pbackend.ec, pbackend.client_id, AUD,
                                                       headers={"kid": pbackend.rsa.kid}),
        "unknown client": assertion(pbackend.rsa, "cli_unknown", AUD),
        "not a JWT": "not.a.jwt",
    }
    for name, signed in cases.items():
        status, _, body = await token(api, token_form(signed))
        assert status in (400, 401) and body["error"] == "invalid_client", (name, status, body)
    status, _, body = await token(api, {**token_form(pbackend.assertion()), "client_assertion_type": "urn:x"})
    assert body["error"] == "invalid_client", body
    # The registered jku is fine; a client_id in the body must be the assertion's.
    assert (await token(api, token_form(pbackend.assertion(headers={"jku": pbackend.host.url}))))[0] == 200
    status, _, body = await token(api, token_form(pbackend.assertion(), client_id="cli_other"))
    assert status == 401 and body["error"] == "invalid_client"
    # One method at a time: a secret beside the assertion is refused.
    status, _, body = await token(api, token_form(pbackend.assertion(), client_secret=pbackend.secret))
    assert status == 400 and body["error"] == "invalid_request"


@pytest.mark.gen_test
async def test_a_jti_is_spent_once(api, pbackend):
    signed = pbackend.assertion()
    assert (await token(api, token_form(signed)))[0] == 200
    status, _, body = await token(api, token_form(signed))
    assert status == 401 and body["error"] == "invalid_client"
    same_jti = pbackend.assertion(jti=jwt.decode(signed, options={"verify_signature": False})["jti"])
    assert (await token(api, token_form(same_jti)))[0] == 401  # a new assertion, the same jti


@pytest.mark.gen_test
async def test_an_exp_that_is_no_whole_second_is_a_numeric_date_like_any_other(api, pbackend):
    """RFC 7519's NumericDate may be non-integer: a backend that signs `"exp": time.time() + 240`
    (PyJWT keeps the float) gets its token, and its jti is spent like any other."""
    now = pbackend.clock.time()
    signed = pbackend.assertion(exp=now + 240.25)
    status, _, body = await token(api, token_form(signed))
    assert status == 200 and body["token_type"] == "bearer", body
    status, _, body = await token(api, token_form(signed))
    assert status == 401 and "already used" in body["error_description"], body
    for name, claims in {"expired": {"exp": now - 0.5}, "too far ahead": {"exp": now + 400.5},
                         "nbf ahead": {"exp": now + 60.5, "nbf": now + 30.5}, "exp true": {"exp": True}}.items():
        status, _, body = await token(api, token_form(pbackend.assertion(**claims)))
        assert status == 401 and body["error"] == "invalid_client", (name, body)


@pytest.mark.gen_test
async def test_a_spent_jti_outlives_a_host_whose_clock_runs_ahead(api, runtime, pbackend):
    """Two hosts share the spent jtis; each drops them by its own clock. A host 10 minutes ahead
    spends another assertion (dropping what it thinks expired); the first assertion, replayed to a
    host on time, must still be refused."""
    signed = pbackend.assertion(exp_in=60)
    assert (await token(api, token_form(signed)))[0] == 200
    runtime.clock.advance(600)  # the host whose clock runs ahead
    assert (await token(api, token_form(pbackend.assertion())))[0] == 200
    runtime.clock.advance(-600)  # the host on time, while `signed` is still unexpired
    status, _, body = await token(api, token_form(signed))
    assert status == 401 and "already used" in body["error_description"], body


@pytest.mark.gen_test
async def test_the_jwks_url_is_cached_and_refetched_on_an_unknown_kid_at_most_once_a_minute(api, runtime, pbackend):
    await system_token(api, pbackend)
    await system_token(api, pbackend, pair=pbackend.ec)
    assert pbackend.host.hits == 1  # cached
    rotated = KeyPair("ES384")
    pbackend.host.document = jwks(pbackend.rsa, rotated)  # the backend rotates a key
    status, _, body = await token(api, token_form(pbackend.assertion(rotated)))
    assert status == 401 and body["error"] == "invalid_client"  # fetched less than a minute ago: not again
    assert pbackend.host.hits == 1
    runtime.clock.advance(61)
    await system_token(api, pbackend, pair=rotated)  # an unknown kid, a minute later: one refetch
    assert pbackend.host.hits == 2
    for _ in range(3):  # made-up kids: no further fetch within the minute
        status, _, body = await token(api, token_form(pbackend.assertion(headers={"kid": uuid.uuid4().hex})))
        assert status == 401 and body["error"] == "invalid_client"
    assert pbackend.host.hits == 2
    pbackend.host.status = 503  # the host goes down: the keys fetched before keep working, for an hour
    runtime.clock.advance(301)
    await system_token(api, pbackend, pair=rotated)
    assert pbackend.host.hits == 3
    runtime.clock.advance(3600)
    status, _, body = await token(api, token_form(pbackend.assertion(rotated)))
    assert status == 401 and "could not be read" in body["error_description"], body
    assert pbackend.host.hits == 4


@pytest.mark.gen_test
async def test_a_re_registered_jwks_url_is_fetched_again_before_a_removed_key_verifies(api, runtime, pbackend):
    """A partner's RSA key leaks: it publishes a JWKS without it, the operator stops the app's key
    pair at once (`apps update --no-jwks`), then registers its URL again. The keys this process had
    cached from that URL a minute before must not come back: the re-registered URL is fetched again
    at the next assertion (the same holds for a re-registration without `--no-jwks` first), yet
    applications changing in a loop make at most one fetch per RECHECK_INTERVAL."""
    assert (await token(api, token_form(pbackend.assertion())))[0] == 200
    assert pbackend.host.hits == 1
    runtime.clock.advance(RECHECK_INTERVAL)  # the partner and the operator take a few seconds
    pbackend.host.document = jwks(pbackend.ec)  # the leaked RSA key is gone from the URL
    set_backend_keys(runtime, pbackend.app.id)
    status, _, body = await token(api, token_form(pbackend.assertion()))
    assert status == 401 and body["error"] == "invalid_client", body
    set_backend_keys(runtime, pbackend.app.id, jwks_url=pbackend.host.url)
    status, _, body = await token(api, token_form(pbackend.assertion()))
    assert status == 401 and body["error"] == "invalid_client", body
    assert pbackend.host.hits == 2
    assert (await token(api, token_form(pbackend.assertion(pbackend.ec))))[0] == 200
    runtime.clock.advance(RECHECK_INTERVAL)
    pbackend.host.document = jwks(pbackend.rsa)  # the next rotation, re-registered without --no-jwks
    set_backend_keys(runtime, pbackend.app.id, jwks_url=pbackend.host.url)
    status, _, body = await token(api, token_form(pbackend.assertion(pbackend.ec)))
    assert status == 401 and body["error"] == "invalid_client", body
    assert pbackend.host.hits == 3
    for _ in range(3):  # changes in a loop: no fetch within RECHECK_INTERVAL of the last
        set_system_scopes(runtime, pbackend.app.id, SCOPES)
        assert (await token(api, token_form(pbackend.assertion())))[0] == 200
    assert pbackend.host.hits == 3
    runtime.clock.advance(RECHECK_INTERVAL)
    assert (await token(api, token_form(pbackend.assertion())))[0] == 200
    assert pbackend.host.hits == 4  # the last change, heard once the interval passed
    assert (await token(api, token_form(pbackend.assertion())))[0] == 200
    assert pbackend.host.hits == 4  # then cached as before


@pytest.mark.gen_test
async def test_a_kid_selects_one_key_of_the_type_its_alg_needs(api, runtime, pbackend):
    """RFC 7517 4.5 lets an RSA and an EC key share a kid (alternatives of different kty), and SMART
    selects the key by kid and kty; two keys of one type under one kid select none (SMART: "more
    than one key matches: the verification fails"), at a JWKS URL as in a registered file."""
    rsa, ec = KeyPair("RS384", kid="shared"), KeyPair("ES384", kid="shared")
    pbackend.host.document = jwks(rsa, ec)
    for pair in (rsa, ec):
        status, _, body = await token(api, token_form(pbackend.assertion(pair)))
        assert status == 200, (pair.alg, body)
    twin = KeyPair("ES384", kid="shared")
    pbackend.host.document = jwks(rsa, ec, twin)
    runtime.clock.advance(CACHE_SECONDS + 1)
    for pair in (ec, twin):
        status, _, body = await token(api, token_form(pbackend.assertion(pair)))
        assert status == 401 and "No single ES384 key" in body["error_description"], body
    assert (await token(api, token_form(pbackend.assertion(rsa))))[0] == 200
    set_backend_keys(runtime, pbackend.app.id, jwks_text=json.dumps(jwks(rsa, ec)))
    assert (await token(api, token_form(pbackend.assertion(ec))))[0] == 200
    with pytest.raises(ApiError, match="names two EC keys"):
        set_backend_keys(runtime, pbackend.app.id, jwks_text=json.dumps(jwks(rsa, ec, twin)))


@pytest.mark.gen_test
async def test_failed_assertions_are_throttled_without_locking_out_the_client(api, runtime, pbackend):
    forger = KeyPair("RS384", kid=pbackend.rsa.kid)
    limit = runtime.settings.auth_failure_limit[0]
    statuses = [(await token(api, token_form(assertion(forger, pbackend.client_id, AUD))))[0] for _ in range(limit + 2)]
    assert statuses[:limit] == [401] * limit and statuses[-1] == 429, statuses
    assert (await token(api, token_form(pbackend.assertion())))[0] == 200  # the key's owner still gets in


@pytest.mark.gen_test
async def test_a_stored_jwks_and_the_secret_grant_both_work(api, runtime, pbackend):
    set_backend_keys(runtime, pbackend.app.id, jwks_text=json.dumps(jwks(pbackend.ec)))
    assert (await token(api, token_form(pbackend.assertion(pbackend.ec))))[0] == 200
    status, _, body = await token(api, token_form(pbackend.assertion(headers={"jku": pbackend.host.url})))
    assert status == 401  # no URL registered any more: a jku names nothing
    # The partner API's secret-based client_credentials is unchanged.
    status, _, body = await api.call("POST", "/v1/oauth/token", {
        "grant_type": "client_credentials", "client_id": pbackend.client_id, "client_secret": pbackend.secret})
    assert status == 200 and body["scope"] == "partner_api" and body["token_type"] == "Bearer"


# -- the FHIR API --------------------------------------------------------------------------------

@pytest.mark.gen_test
async def test_a_system_token_reads_and_searches_enabled_clinics_only(api, runtime, world, pbackend):
    assert pbackend.installation.activation_status == "Disabled"  # no SDK initialization for a pbackend
    access = (await system_token(api, pbackend))["access_token"]
    status, _, body = await fhir(api, world.org.id, f"/Patient/{SMART_PATIENT}", access)
    assert status == 403, body  # installed, not Enabled yet
    await enable(api, pbackend, world.org.id)
    status, _, bundle = await fhir(api, world.org.id, "/Patient?_count=3", access)
    assert status == 200 and bundle["type"] == "searchset" and bundle["entry"], bundle
    patient_id = bundle["entry"][0]["resource"]["id"]
    status, _, patient = await fhir(api, world.org.id, f"/Patient/{patient_id}", access)
    assert status == 200 and patient["id"] == patient_id, patient
    status, headers, bundle = await fhir(api, world.org.id, f"/Observation?patient={patient_id}&_count=5", access)
    assert status == 200 and bundle["type"] == "searchset" and bundle["entry"], bundle
    assert "RateLimit-Limit" in headers  # limited like any FHIR token
    status, _, body = await fhir(api, world.org.id, f"/Encounter?patient={patient_id}", access)
    assert status == 403 and body["resourceType"] == "OperationOutcome"  # not in its scopes
    other, _ = clinic("Other Clinic", "https://ehr.example/other")
    assert (await fhir(api, other.id, f"/Patient/{SMART_PATIENT}", access))[0] == 404  # not installed there
    install_application(pbackend.app.id, other.id)
    assert (await fhir(api, other.id, f"/Patient/{SMART_PATIENT}", access))[0] == 403  # installed, Disabled
    # Every answer it got is a disclosure record: the client, the token's jti and scope, no user.
    claims = jwt.decode(access, options={"verify_signature": False})
    records = list(DisclosureRecord.select().where(DisclosureRecord.jti == claims["jti"]).order_by(DisclosureRecord.seq))
    # (an authentication refusal, as the first 403, is not a disclosure: nothing was read)
    assert [(r.action, r.status) for r in records] == [("search", 200), ("read", 200), ("search", 200),
                                                        ("search", 403)], [(r.action, r.status) for r in records]
    for record in records:
        assert record.client_id == pbackend.client_id and record.user_id is None and record.scope == SCOPES
        assert record.application_id == pbackend.app.id and record.organization_id == world.org.id
    assert patient_id in records[1].patients and patient_id in records[2].patients

@pytest.mark.gen_test
async def test_a_system_token_is_rate_limited_and_held_to_the_registration_now(api, runtime, world, pbackend):
    from lifecycle.applications import set_fhir_rate_limits
    from ratelimit.policy import Limit
    await enable(api, pbackend, world.org.id)
    access = (await system_token(api, pbackend))["access_token"]
    set_fhir_rate_limits(runtime, pbackend.app.id, fhir_token_rate_limit=Limit(2, 60))
    statuses = [(await fhir(api, world.org.id, "/Patient?_count=1", access))[0] for _ in range(3)]
    assert statuses == [200, 200, 429], statuses
    access = (await system_token(api, pbackend))["access_token"]  # a new token: its own budget
    assert (await fhir(api, world.org.id, "/Patient?_count=1", access))[0] == 200
    set_system_scopes(runtime, pbackend.app.id, "system/Observation.rs")  # Patient no longer registered
    status, headers, body = await fhir(api, world.org.id, "/Patient?_count=1", access)
    assert status == 403 and "insufficient_scope" in headers["WWW-Authenticate"], body


@pytest.mark.gen_test
async def test_a_revoked_system_token_reaches_nothing(api, world, pbackend):
    await enable(api, pbackend, world.org.id)
    access = (await system_token(api, pbackend))["access_token"]
    assert (await fhir(api, world.org.id, "/Patient?_count=1", access))[0] == 200
    status, _, _ = await api.call("POST", "/v1/oauth/revoke", body=urllib.parse.urlencode(
        {"token": access, "client_assertion_type": ASSERTION_TYPE, "client_assertion": pbackend.assertion()}),
        headers=FORM)
    assert status == 200
    status, headers, _ = await fhir(api, world.org.id, "/Patient?_count=1", access)
    assert status == 401 and 'error="invalid_token"' in headers["WWW-Authenticate"]


@pytest.mark.gen_test
async def test_the_backend_introspects_its_own_system_token(api, world, pbackend):
    access = (await system_token(api, pbackend))["access_token"]
    status, _, body = await api.call("POST", "/v1/oauth/introspect", body=urllib.parse.urlencode(
        {"token": access, "client_assertion_type": ASSERTION_TYPE, "client_assertion": pbackend.assertion()}),
        headers=FORM)
    assert status == 200 and body["active"] is True and body["scope"] == SCOPES, body
    assert body["client_id"] == pbackend.client_id and body["aud"] == "fhir-system"
    # Another client learns nothing of it.
    status, _, body = await api.call("POST", "/v1/oauth/introspect", body=urllib.parse.urlencode(
        {"token": access, "client_id": world.app.client_id, "client_secret": world.secret}), headers=FORM)
    assert status == 200 and body == {"active": False}


@pytest.mark.gen_test
async def test_a_system_token_is_no_user_or_partner_token(api, world, pbackend):
    access = (await system_token(api, pbackend))["access_token"]
    auth = {"Authorization": f"Bearer {access}"}
    assert (await api.call("GET", "/v1/oauth/userinfo", headers=auth))[0] == 401
    assert (await api.call("GET", f"/v1/applications/{pbackend.app.id}/organizations", headers=auth))[0] == 401


@pytest.mark.gen_test
async def test_discovery_documents_say_private_key_jwt(api, world):
    status, _, doc = await api.call("GET", f"/fhir/r4/{world.org.id}/.well-known/smart-configuration")
    assert status == 200
    assert "private_key_jwt" in doc["token_endpoint_auth_methods_supported"]
    assert {"RS384", "ES384"} <= set(doc["token_endpoint_auth_signing_alg_values_supported"])
    assert {"client-confidential-asymmetric", "permission-v1", "permission-v2"} <= set(doc["capabilities"])
    assert doc["token_endpoint"] == AUD and "client_credentials" in doc["grant_types_supported"]
    for path in ("/.well-known/openid-configuration", "/.well-known/oauth-authorization-server"):
        status, _, meta = await api.call("GET", path)
        assert status == 200 and "private_key_jwt" in meta["token_endpoint_auth_methods_supported"], path
    status, _, statement = await api.call("GET", f"/fhir/r4/{world.org.id}/metadata")
    oauth = statement["rest"][0]["security"]["extension"][0]
    assert {"url": "token", "valueUri": AUD} in oauth["extension"]


@pytest.mark.gen_test
async def test_an_app_installed_before_its_keys_is_enabled_without_sdk_initialization(api, runtime, world, pbackend):
    assert Installation.find(pbackend.app.id, world.org.id).activation_status == "Disabled"
    other, _ = clinic("Early Clinic", "https://ehr.example/early")
    install_application(world.app.id, other.id)  # a plain app: no status until its SDK initializes
    status, _, body = await api.call("POST", "/v1/oauth/token", {
        "grant_type": "client_credentials", "client_id": world.app.client_id, "client_secret": world.secret})
    auth = {"Authorization": f"Bearer {body['access_token']}"}
    path = f"/v1/applications/{world.app.id}/organizations/{other.id}/activation-status"
    status, _, body = await api.call("PUT", path, {"status": "Enabled"}, headers=auth)
    assert status == 409 and body["error"] == "not_initialized"  # unchanged for an SDK app
    set_backend_keys(runtime, world.app.id, jwks_url=pbackend.host.url)  # it becomes a backend app
    status, _, body = await api.call("PUT", path, {"status": "Enabled"}, headers=auth)
    assert status == 200 and body["status"] == "Enabled" and body["trial_started_at"], body


# -- registration (the operator CLI, a real process) ---------------------------------------------

def test_cli_registers_keys_and_system_scopes(cli, runtime, world, tmp_path, key_pairs):
    rsa, ec = key_pairs
    created = json.loads(cli("apps", "create", "--name", "Population Health", "--redirect-uri",
                             "https://pop.example/cb", "--launch-url", "https://pop.example/launch",
                             "--jwks-url", "https://pop.example/.well-known/jwks.json",
                             "--system-scopes", "system/Patient.rs system/*.rs system/Patient.rs", "--json").stdout)
    assert created["jwks_url"] == "https://pop.example/.well-known/jwks.json" and created["client_secret"]
    assert created["system_scopes"] == "system/Patient.rs system/*.rs" and created["jwks_stored"] is False
    app_id = created["application_id"]
    install = json.loads(cli("installs", "create", "--app", app_id, "--org", world.org.id, "--json").stdout)
    assert install["activation_status"] == "Disabled"
    (tmp_path / "jwks.json").write_text(json.dumps(jwks(rsa, ec)))
    updated = json.loads(cli("apps", "update", "--app", app_id, "--jwks-file", str(tmp_path / "jwks.json"),
                             "--system-scopes", "system/Observation.read", "--json").stdout)
    assert updated["jwks_url"] is None and updated["jwks_stored"] is True
    shown = json.loads(cli("apps", "show", "--app", app_id, "--json").stdout)
    assert shown["jwks_stored"] is True and shown["system_scopes"] == "system/Observation.read"
    assert shown["jwks_url"] is None
    cli("apps", "update", "--app", app_id, "--jwks-url", "http://localhost:9999/jwks.json", "--json")
    cli("apps", "update", "--app", app_id, "--jwks-url", "http://[::1]:9999/jwks.json", "--json")


def test_cli_refuses_bad_keys_urls_and_scopes(cli, runtime, world, tmp_path, key_pairs):
    rsa, ec = key_pairs
    app_id = json.loads(cli("apps", "create", "--name", "B", "--redirect-uri", "https://b.example/cb",
                            "--launch-url", "https://b.example/l", "--json").stdout)["application_id"]
    small = KeyPair("RS384", bits=1024)
    p256 = {"kty": "EC", "crv": "P-256", "kid": "p256", "x": "AAAA", "y": "AAAA"}
    files = {
        "private key material": {"keys": [rsa.private_jwk()]},
        "an RSA key under 2048 bits": jwks(small),
        "an EC key not on P-384": {"keys": [p256]},
        "an RSA exponent of 1 (any signature verifies)": {"keys": [{**rsa.public_jwk, "e": "AQ"}]},
        "an EC point not on the curve": {"keys": [{**ec.public_jwk, "y": ec.public_jwk["x"]}]},
        "a symmetric key": {"keys": [{"kty": "oct", "kid": "s", "k": "c2VjcmV0"}]},
        "a key without kid": {"keys": [{k: v for k, v in rsa.public_jwk.items() if k != "kid"}]},
        "an RS256 key": {"keys": [{**rsa.public_jwk, "alg": "RS256"}]},
        "no keys": {"keys": []},
        "not a JWKS": ["x"],
        "a kty that is a JSON array": {"keys": [{**rsa.public_jwk, "kty": ["RSA"]}]},
        "an alg that is a JSON object": {"keys": [{**rsa.public_jwk, "alg": {"RS384": 1}}]},
    }
    for name, document in files.items():
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(document))
        result = cli("apps", "update", "--app", app_id, "--jwks-file", str(path), "--json", expect=2)
        assert result.stderr.strip(), name
    for url in ("http://pop.example/jwks.json", "ftp://pop.example/jwks", "https://user:pw@pop.example/j",
                "jwks.json"):
        assert "JWKS URL" in cli("apps", "update", "--app", app_id, "--jwks-url", url, "--json", expect=2).stderr
    for scope in ("patient/Patient.rs", "system/Patient.cruds", "system/Nope.rs", "system/Patient.write"):
        assert cli("apps", "update", "--app", app_id, "--system-scopes", scope, "--json", expect=2).stderr
    cli("apps", "create", "--name", "C", "--redirect-uri", "https://c.example/cb", "--launch-url", "https://c.example/l",
        "--system-scopes", "user/*.rs", expect=2)
    assert json.loads(cli("apps", "show", "--app", app_id, "--json").stdout)["jwks_stored"] is False
    from models.application import Application
    assert Application.select().where(Application.name == "C").count() == 0  # a bad flag creates nothing


# -- the JWKS URL's bounds, and the spent jtis across processes ----------------------------------

@pytest.mark.gen_test(timeout=40)
async def test_a_jwks_url_that_redirects_is_too_big_or_too_slow_verifies_nothing(api, runtime, pbackend):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    release = threading.Event()

    class Hostile(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/redirect":
                self.send_response(302)
                self.send_header("Location", pbackend.host.url)
                self.end_headers()
            elif self.path == "/huge":
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b'{"keys": [' + b" " * (200 * 1024) + b"]}")
            else:  # /slow: headers, then nothing until the test ends
                self.send_response(200)
                self.end_headers()
                self.wfile.flush()
                release.wait(30)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for path in ("/redirect", "/huge", "/slow"):
            set_backend_keys(runtime, pbackend.app.id, jwks_url=f"http://127.0.0.1:{server.server_address[1]}{path}")
            started = time.monotonic()
            status, _, body = await token(api, token_form(pbackend.assertion()))
            assert status == 401 and body["error"] == "invalid_client", (path, body)
            assert "could not be read" in body["error_description"], body
            assert time.monotonic() - started < 30, path  # the fetch's deadline ended it, not the server
    finally:
        release.set()
        server.shutdown()
        server.server_close()


@pytest.mark.gen_test(timeout=60)
async def test_a_jwks_host_that_drips_its_headers_or_serves_unhashable_members_verifies_nothing_in_time(
        api, runtime, pbackend):
    """A per-read timeout is not a deadline: a host that sends a header byte every 0.3 s must not
    hold the fetch (and a pool thread) past FETCH_TIMEOUT; a key whose kty or alg is a JSON array
    or object is skipped, not a 500."""
    import socket
    import threading
    from oauth.client_jwks import FETCH_TIMEOUT

    release = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    bodies = {b"/unhashable-kty": {"keys": [{"kty": ["RSA"], "kid": pbackend.rsa.kid, "n": "AQAB", "e": "AQAB"}]},
              b"/unhashable-alg": {"keys": [{**pbackend.rsa.public_jwk, "alg": {"RS384": 1}}]}}

    def serve(connection):
        with connection:
            path = connection.recv(4096).split(b" ")[1]
            if path == b"/drip":
                connection.sendall(b"HTTP/1.1 200 OK\r\nX-Drip: ")
                for _ in range(200):  # 60 s of one byte every 0.3 s, unless the client hung up
                    if release.wait(0.3):
                        return
                    try:
                        connection.sendall(b"a")
                    except OSError:
                        return
            else:
                body = json.dumps(bodies[path]).encode()
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    def accept():
        while not release.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(connection,), daemon=True).start()
    threading.Thread(target=accept, daemon=True).start()
    try:
        for path in ("/drip", "/unhashable-kty", "/unhashable-alg"):
            set_backend_keys(runtime, pbackend.app.id, jwks_url=f"http://127.0.0.1:{port}{path}")
            started = time.monotonic()
            status, _, body = await token(api, token_form(pbackend.assertion()))
            assert status == 401 and body["error"] == "invalid_client", (path, status, body)
            assert time.monotonic() - started < FETCH_TIMEOUT + 3, path
    finally:
        release.set()
        listener.close()


async def wait_for(event) -> None:
    """Until `event` (a threading.Event) is set, leaving the IOLoop free to serve the requests."""
    assert await asyncio.get_running_loop().run_in_executor(None, event.wait, 20)


@pytest.mark.gen_test(timeout=40)
async def test_a_jwks_fetch_in_progress_makes_no_other_request_wait(api, world, pbackend):
    """The app's JWKS host takes the fetch and says nothing. Meanwhile ten assertions of that app
    (the first of its workers starting together) are answered at once: 503 with Retry-After, since
    nothing is known of their kid yet (an `invalid_client` would tell a client with the right key
    that its key is wrong); and another app's token, which the blocking pool answers, is issued:
    nobody waits on the fetch, nor for a pool thread held by a waiter."""
    from oauth.client_jwks import FETCH_TIMEOUT
    pbackend.host.hold()
    fetching = asyncio.ensure_future(token(api, token_form(pbackend.assertion(headers={"kid": "unknown"}))))
    await wait_for(pbackend.host.asked)
    started = time.monotonic()
    waiting = [token(api, token_form(pbackend.assertion())) for _ in range(10)]
    # world's app has asked nothing yet: no client cached, so its secret is checked on the pool
    unrelated = api.call("POST", "/v1/oauth/token", {"grant_type": "client_credentials",
                                                     "client_id": world.app.client_id, "client_secret": world.secret})
    *refused, (status, _, body) = await asyncio.gather(*waiting, unrelated)
    elapsed = time.monotonic() - started
    assert elapsed < FETCH_TIMEOUT / 2 and not fetching.done(), elapsed  # all answered while it was pending
    assert status == 200 and body["access_token"], body
    for status, headers, body in refused:
        assert status == 503 and body["error"] == "temporarily_unavailable", body
        assert headers["Retry-After"] == "1" and "being fetched" in body["error_description"], body
    pbackend.host.release()
    status, _, body = await fetching
    assert status == 401 and body["error"] == "invalid_client", body
    assert (await token(api, token_form(pbackend.assertion())))[0] == 200  # asked again: the keys are in


@pytest.mark.gen_test(timeout=40)
async def test_jwks_hosts_that_hang_hold_at_most_a_quarter_of_the_pool(api, runtime, world, key_pairs):
    """As many apps as the process allows fetches at once have hosts that take the fetch and say
    nothing: one more app's first assertion is answered at once (503, Retry-After), its host never asked,
    instead of a further pool thread waiting out its deadline; once they answer, it verifies."""
    from oauth.client_jwks import FETCH_TIMEOUT
    allowed = runtime.settings.db_threads // 4
    assert allowed >= 1
    rsa, ec = key_pairs
    hosts = [JwksHost(jwks(rsa, ec)) for _ in range(allowed + 1)]
    backends = [Backend(runtime, world, host, rsa, ec) for host in hosts]
    for host in hosts[:allowed]:
        host.hold()
    try:
        hanging = [asyncio.ensure_future(token(api, token_form(b.assertion()))) for b in backends[:allowed]]
        for host in hosts[:allowed]:
            await wait_for(host.asked)
        started = time.monotonic()
        status, _, body = await token(api, token_form(backends[-1].assertion()))
        assert time.monotonic() - started < FETCH_TIMEOUT / 2
        assert status == 503 and "being fetched" in body["error_description"], body
        assert hosts[-1].hits == 0
        for host in hosts[:allowed]:
            host.release()
        assert [status for status, _, _ in await asyncio.gather(*hanging)] == [200] * allowed
        assert (await token(api, token_form(backends[-1].assertion())))[0] == 200
    finally:
        for host in hosts:
            host.release()
            host.close()


@pytest.mark.gen_test(timeout=40)
async def test_cached_keys_verify_while_the_jwks_url_is_refetched(api, runtime, pbackend):
    """An unknown kid a minute later refetches the URL; while its host is silent, the cached keys
    verify at once, and other unknown kids are answered at once: 503, try again when the keys are in."""
    from oauth.client_jwks import FETCH_TIMEOUT
    await system_token(api, pbackend)
    runtime.clock.advance(61)
    pbackend.host.hold()
    fetching = asyncio.ensure_future(token(api, token_form(pbackend.assertion(headers={"kid": "rotated"}))))
    await wait_for(pbackend.host.asked)
    started = time.monotonic()
    known = [token(api, token_form(pbackend.assertion(pair))) for pair in (pbackend.rsa, pbackend.ec) * 3]
    unknown = [token(api, token_form(pbackend.assertion(headers={"kid": uuid.uuid4().hex}))) for _ in range(4)]
    answers = await asyncio.gather(*known, *unknown)
    elapsed = time.monotonic() - started
    assert elapsed < FETCH_TIMEOUT / 2 and not fetching.done(), elapsed
    assert [status for status, _, _ in answers[:6]] == [200] * 6, answers
    for status, headers, body in answers[6:]:
        assert status == 503 and headers["Retry-After"] == "1" and "being fetched" in body["error_description"], body
    pbackend.host.release()
    status, _, body = await fetching
    assert status == 401 and body["error"] == "invalid_client", body  # the set has no such kid
    assert pbackend.host.hits == 2


@pytest.mark.gen_test(timeout=40)
async def test_a_jwks_host_whose_every_address_never_connects_is_given_up_at_the_deadline(
        api, runtime, pbackend, monkeypatch):
    """A listener whose one-place backlog is full drops new connections' SYNs: connect() hangs. The
    host's name resolves to two such addresses; the fetch gives up on both within FETCH_TIMEOUT
    (socket.create_connection would give each address the whole timeout)."""
    import socket
    from oauth.client_jwks import FETCH_TIMEOUT
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port), timeout=5)  # the backlog's place, never accepted
    probe = socket.socket()
    probe.settimeout(0.3)
    with pytest.raises(TimeoutError), probe:  # a connect hangs there (else this test proves nothing)
        probe.connect(("127.0.0.1", port))
    resolve = socket.getaddrinfo

    def two_addresses(host, *args, **kwargs):
        return resolve("127.0.0.1", *args, **kwargs) * 2 if host == "jwks.localhost" else resolve(host, *args, **kwargs)
    monkeypatch.setattr(socket, "getaddrinfo", two_addresses)
    try:
        set_backend_keys(runtime, pbackend.app.id, jwks_url=f"http://jwks.localhost:{port}/jwks.json")
        started = time.monotonic()
        status, _, body = await token(api, token_form(pbackend.assertion()))
        elapsed = time.monotonic() - started
        assert status == 401 and "could not be read" in body["error_description"], body
        assert elapsed < FETCH_TIMEOUT + 2, elapsed
    finally:
        filler.close()
        listener.close()


@pytest.mark.gen_test(timeout=30)
async def test_a_spent_jti_is_spent_for_every_process(api, live, pbackend):
    """The same database, two processes: this test's server and a real `svc-auth serve`."""
    from helpers.http import LiveHttp
    signed = pbackend.assertion(aud=[AUD, f"{live}/v1/oauth/token"])
    assert (await token(api, token_form(signed)))[0] == 200
    status, _, body = LiveHttp(live).call("POST", "/v1/oauth/token", form=token_form(signed))
    assert status == 401 and body["error"] == "invalid_client", body
    fresh = pbackend.assertion(aud=f"{live}/v1/oauth/token")
    status, _, body = LiveHttp(live).call("POST", "/v1/oauth/token", form=token_form(fresh))
    assert status == 200 and body["token_type"] == "bearer", body


@pytest.mark.gen_test
async def test_an_assertion_authenticates_the_code_grant_too(api, flow, runtime, world, key_pairs):
    rsa, _ = key_pairs
    set_backend_keys(runtime, world.app.id, jwks_text=json.dumps(jwks(rsa)))
    code = await flow.code()
    form = {"grant_type": "authorization_code", "code": code, "client_assertion_type": ASSERTION_TYPE,
            "client_assertion": assertion(rsa, world.app.client_id, AUD)}
    status, _, body = await token(api, form)
    assert status == 200 and body["id_token"], body


@pytest.mark.gen_test
async def test_hostile_assertions_are_4xx(api, pbackend):
    import base64

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
    deep = b64(b"[" * 5000 + b"]" * 5000)
    header = b64(json.dumps({"alg": "RS384", "kid": pbackend.rsa.kid}).encode())
    claims = b64(json.dumps({"iss": pbackend.client_id, "sub": pbackend.client_id, "aud": AUD,
                             "exp": int(time.time()) + 60, "jti": uuid.uuid4().hex}).encode())
    unhashable = [b64(json.dumps({"alg": alg, "kid": pbackend.rsa.kid}).encode()) for alg in (["RS384"], {"a": 1})]
    for value in (f"{header}.{deep}.c2ln", f"{deep}.{deep}.c2ln", "a" * 20000, "..", f"{header}.bm90IGpzb24.c2ln",
                  f"{header}.{b64(json.dumps(['iss']).encode())}.c2ln",
                  *(f"{h}.{claims}.c2ln" for h in unhashable)):  # an alg that is a JSON array or object
        status, _, body = await token(api, token_form(value))
        assert status in (400, 401) and body["error"] == "invalid_client", (value[:40], status, body)
    status, _, body = await token(api, {**token_form(pbackend.assertion()), "scope": "system/Patient.rs\x00"})
    assert status == 400 and body["error"] == "invalid_request"


# -- the documentation's example runs as written -------------------------------------------------

def test_the_docs_python_example_gets_a_token_and_reads(live, runtime, world, tmp_path, monkeypatch):
    """docs/bulk-data.md's key-pair and token examples, run as a partner would (the placeholders
    filled in), against a real `svc-auth serve`."""
    import re
    from helpers.environment import ROOT
    from lifecycle.activation import set_activation_status
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "bulk-data.md").read_text(), re.S)
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)
    made: dict = {}
    exec(blocks[0], made)  # writes backend-key.pem and jwks.json, prints the kid
    app, _ = register_application(runtime, "Docs Backend", "https://docs.example/cb", "https://docs.example/l")
    set_backend_keys(runtime, app.id, jwks_text=(tmp_path / "jwks.json").read_text())
    set_system_scopes(runtime, app.id, "system/Patient.rs system/Observation.rs")
    installation = install_application(app.id, world.org.id)
    set_activation_status(runtime, installation, "Enabled", actor="test")
    example = blocks[1].replace("https://svc.example/fhir/r4/ORG_ID", f"{live}/fhir/r4/{world.org.id}")
    ran: dict = {"CLIENT_ID": app.client_id, "KID": made["kid"]}
    example = example.replace('"PATIENT_ID"', 'bundle["entry"][0]["resource"]["id"]')
    exec(example, ran)
    assert ran["answer"]["token_type"] == "bearer" and ran["answer"]["scope"] == "system/Patient.rs system/Observation.rs"
    assert ran["bundle"]["type"] == "searchset" and ran["bundle"]["entry"]
    assert ran["observations"]["type"] == "searchset"


@pytest.mark.slow
def test_a_system_token_reads_a_clinic_on_a_fhir_ehr(live, runtime, world, fhir_ehr, pbackend):
    """A clinic on a real FHIR EHR (tests/js/fhir_ehr.mjs), a real `svc-auth serve`: the system token
    reads and searches what the EHR holds, through the connector, within its scopes."""
    from helpers.fhir_api import Fhir, resources
    from helpers.fhir_ehr import chart_record, connect_clinic, patient
    from helpers.http import LiveHttp
    from lifecycle.activation import set_activation_status
    org_id = connect_clinic(runtime.settings, fhir_ehr, f"{live}/ehr/jwks.json", name="Backend FHIR Clinic")
    fhir_ehr.seed(patient("pt-a", "Doe", "Jane", "1970-01-02", "female"), *chart_record("pt-a", encounters=1,
                                                                                          observations=2))
    installation = install_application(pbackend.app.id, org_id)
    set_activation_status(runtime, installation, "Enabled", actor="test")
    status, _, answer = LiveHttp(live).call("POST", "/v1/oauth/token", form=token_form(
        pbackend.assertion(aud=f"{live}/v1/oauth/token"), "system/Patient.rs system/Observation.rs"))
    assert status == 200, answer
    fhir = Fhir(live, org_id, answer["access_token"])
    assert fhir.ok("/Patient/pt-a")["birthDate"] == "1970-01-02"
    observations = resources(fhir.search("Observation", {"patient": "pt-a"}))
    assert observations and all(o["subject"]["reference"] == "Patient/pt-a" for o in observations)
    status, _, body = fhir.get("/Encounter", {"patient": "pt-a"})
    assert status == 403, body  # not in its scopes
    assert Fhir(live, world.org.id, answer["access_token"]).get("/Patient")[0] == 403  # installed, not Enabled


@pytest.mark.gen_test
async def test_discovery_lists_exactly_the_auth_methods_introspection_and_revocation_take(api, world, pbackend,
                                                                                           runtime):
    """RFC 8414 2: `{introspection,revocation}_endpoint_auth_methods_supported` tell the truth. Each
    method is tried at each endpoint over HTTP (the token is junk: an authenticated client gets 200)."""
    from helpers.http import basic_auth
    from lifecycle.applications import set_public
    public, _ = register_application(runtime, "Browser", "https://browser.example/cb", "https://browser.example/l")
    public, _ = set_public(runtime, public.id, True)
    methods = {
        "client_secret_basic": lambda: ({"token": "junk"},
                                        {"Authorization": basic_auth(world.app.client_id, world.secret)}),
        "client_secret_post": lambda: ({"token": "junk", "client_id": world.app.client_id,
                                        "client_secret": world.secret}, {}),
        "none": lambda: ({"token": "junk", "client_id": public.client_id}, {}),
        "private_key_jwt": lambda: ({"token": "junk", "client_assertion_type": ASSERTION_TYPE,
                                     "client_assertion": pbackend.assertion()}, {}),
    }
    taken = {}
    for endpoint in ("introspect", "revoke"):
        taken[endpoint] = set()
        for method, request in methods.items():
            form, headers = request()
            status, _, _ = await api.call("POST", f"/v1/oauth/{endpoint}", body=urllib.parse.urlencode(form),
                                          headers={**FORM, **headers})
            assert status in (200, 401), (endpoint, method, status)
            if status == 200:
                taken[endpoint].add(method)
    assert taken["introspect"] == {"client_secret_basic", "client_secret_post", "private_key_jwt"}
    for path in ("/.well-known/openid-configuration", "/.well-known/oauth-authorization-server"):
        status, _, meta = await api.call("GET", path)
        assert status == 200
        assert set(meta["introspection_endpoint_auth_methods_supported"]) == taken["introspect"], path
        assert set(meta["revocation_endpoint_auth_methods_supported"]) == taken["revoke"], path
        for endpoint in ("introspection", "revocation"):  # RFC 8414: present with private_key_jwt
            assert set(meta[f"{endpoint}_endpoint_auth_signing_alg_values_supported"]) == {"RS384", "ES384"}, path


def test_an_update_refused_part_way_changes_nothing(cli, world):
    """`apps update` wrote its options one by one: `--name` was kept when `--smart-scopes` was then
    refused (exit 2). Now all of them or none."""
    before = json.loads(cli("apps", "show", "--app", world.app.id, "--json").stdout)
    result = cli("apps", "update", "--app", world.app.id, "--name", "Renamed", "--require-pkce",
                 "--smart-scopes", "bogus/scope", "--json", expect=2)
    assert "scope" in result.stderr.lower()
    after = json.loads(cli("apps", "show", "--app", world.app.id, "--json").stdout)
    assert after == before
