"""Each identity rule decided once (issue 30), asserted through the HTTP interfaces that ask it:
one bearer gate (the same RFC 6750 challenge from userinfo, the partner API and the FHIR API), one
activation rule (a Disabled installation refused alike by every path that opens or uses the app),
one builder of endpoint URLs, one id grammar, and SMART's launch context only with its scope."""
from __future__ import annotations

import re
import urllib.parse

import pytest
from jose import jwt

from helpers.http import basic_auth
from helpers.rest import partner_headers
from lifecycle.activation import set_activation_status
from lifecycle.verification import record_platform_verification
from models.application import Installation
from oauth.tokens import PLATFORM_AUDIENCE

PATIENT = "pat-b15c092f2447b7a2"
DISABLED = "The application is Disabled in this organization"
CHALLENGE = re.compile(r'Bearer (error="invalid_token", error_description="[^"\\]+", )?realm="svc-auth"')


def query_of(location: str) -> dict:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(location).query))


def iss_of(runtime, world) -> str:
    return runtime.fhir_base_url(world.org.id)


async def launch(api, world, patient_id=None):
    body = {"client_id": world.app.client_id, **({"patient_id": patient_id} if patient_id is not None else {})}
    return await api.call("POST", "/v1/sandbox/launches", body,
                          headers={"Authorization": f"Bearer {world.sandbox_token}"})


async def smart_code(api, runtime, world, scope="openid user/*.rs", patient_id=None) -> str:
    status, _, answer = await launch(api, world, patient_id)
    assert status == 201, answer
    query = {"client_id": world.app.client_id, "redirect_uri": world.app.redirect_uri, "response_type": "code",
             "launch": answer["launch_id"], "aud": iss_of(runtime, world), "scope": scope}
    status, headers, body = await api.call("GET", f"/v1/oauth/authorize?{urllib.parse.urlencode(query)}")
    assert status == 302, body
    return query_of(headers["Location"])["code"]


async def smart_tokens(api, runtime, world, scope="openid user/*.rs", patient_id=None) -> dict:
    code = await smart_code(api, runtime, world, scope, patient_id)
    status, _, tokens = await api.call("POST", "/v1/oauth/token", {
        "grant_type": "authorization_code", "client_id": world.app.client_id, "client_secret": world.secret,
        "code": code})
    assert status == 200, tokens
    return tokens


def disable(world) -> None:
    """As after the first launch, the app is Disabled in the clinic."""
    Installation.update(activation_status="Disabled").where(Installation.application == world.app.id).execute()


# -- one bearer gate ---------------------------------------------------------------------------

@pytest.mark.gen_test
async def test_userinfo_the_partner_api_and_the_fhir_api_challenge_bad_tokens_alike(api, flow, world, runtime):
    """A missing, a malformed, a revoked and an expired token: 401 and one `WWW-Authenticate`
    (RFC 6750 3: a realm; an error and its description, but none for a missing token, 3.1)."""
    partner_path = f"/v1/applications/{world.app.id}/organizations"
    fhir_path = f"/fhir/r4/{world.org.id}/Patient"

    async def challenges(user_token: str | None, client_token: str | None) -> list[str]:
        found = []
        for path, token in (("/v1/oauth/userinfo", user_token), (partner_path, client_token), (fhir_path, user_token)):
            status, headers, body = await api.call("GET", path, headers={"Authorization": f"Bearer {token}"} if token
                                                   else {})
            assert status == 401, (path, body)
            if path == fhir_path:
                assert body["resourceType"] == "OperationOutcome" and body["issue"][0]["code"] == "login", body
            else:
                assert body["error"] == "invalid_token" and body["message"], body
            found.append(headers["WWW-Authenticate"])
        return found

    missing = await challenges(None, None)
    assert missing == ['Bearer realm="svc-auth"'] * 3
    malformed = await challenges("not.a-jwt", "not.a-jwt")
    user_token = (await flow.tokens())["access_token"]
    client_token = (await partner_headers(api, world.app, world.secret))["Authorization"].split(" ", 1)[1]
    for token in (user_token, client_token):
        status, _, _ = await api.call("POST", "/v1/oauth/revoke", {"token": token},
                                      headers={"Authorization": basic_auth(world.app.client_id, world.secret)})
        assert status == 200
    revoked = await challenges(user_token, client_token)
    user_token = (await flow.tokens())["access_token"]
    client_token = (await partner_headers(api, world.app, world.secret))["Authorization"].split(" ", 1)[1]
    runtime.clock.advance(max(runtime.settings.access_token_ttl, runtime.settings.client_token_ttl) + 60)
    expired = await challenges(user_token, client_token)
    for found in (malformed, revoked, expired):
        assert len(set(found)) == 1, found  # the same challenge from all three
        assert CHALLENGE.fullmatch(found[0]) and 'error="invalid_token"' in found[0], found


@pytest.mark.gen_test
async def test_a_scope_the_fhir_api_needs_is_403_insufficient_scope(api, world, runtime):
    tokens = await smart_tokens(api, runtime, world, scope="openid user/Patient.rs")
    status, headers, body = await api.call("GET", f"/fhir/r4/{world.org.id}/Condition",
                                           headers={"Authorization": f"Bearer {tokens['access_token']}"})
    assert status == 403 and body["issue"][0]["code"] == "forbidden", body
    assert re.fullmatch(r'Bearer error="insufficient_scope", error_description="[^"]+", '
                        r'scope="patient/Condition.s user/Condition.s", realm="svc-auth"', headers["WWW-Authenticate"])


# -- one activation rule -------------------------------------------------------------------------

async def refused_hub_open(api, runtime, world, flow):
    disable(world)
    status, _, body = await api.call("GET", "/sandbox/api/apps", headers={"Authorization": f"Bearer {world.sandbox_token}"})
    assert status == 200
    entry = next(e for e in body["apps"] if e["client_id"] == world.app.client_id)
    assert entry["openable"] is False and entry["activation_status"] == "Disabled"
    return await launch(api, world)  # what opening it from the hub does


async def refused_launch(api, runtime, world, flow):
    disable(world)
    return await launch(api, world, PATIENT)


async def refused_authorize(api, runtime, world, flow):
    status, _, answer = await launch(api, world)  # created while the app could be opened
    assert status == 201
    disable(world)
    query = {"client_id": world.app.client_id, "redirect_uri": world.app.redirect_uri, "response_type": "code",
             "launch_id": answer["launch_id"], "state": "s1"}
    status, headers, body = await api.call("GET", f"/v1/oauth/authorize?{urllib.parse.urlencode(query)}")
    assert status == 302, body
    error = query_of(headers["Location"])
    assert error["error"] == "access_denied" and error["state"] == "s1" and "code" not in error
    return 403, headers, {"error": "application_disabled", "message": error["error_description"]}


async def refused_token_exchange(api, runtime, world, flow):
    code = await flow.code()
    disable(world)
    return await flow.exchange(code)


async def refused_userinfo(api, runtime, world, flow):
    tokens = await flow.tokens()
    disable(world)
    return await api.call("GET", "/v1/oauth/userinfo", headers={"Authorization": f"Bearer {tokens['access_token']}"})


async def refused_fhir_api(api, runtime, world, flow):
    tokens = await smart_tokens(api, runtime, world)
    disable(world)
    status, headers, body = await api.call("GET", f"/fhir/r4/{world.org.id}/Patient",
                                           headers={"Authorization": f"Bearer {tokens['access_token']}"})
    assert body["resourceType"] == "OperationOutcome" and body["issue"][0]["code"] == "forbidden", body
    return status, headers, {"error": "application_disabled", "message": body["issue"][0]["diagnostics"]}


async def refused_partner_appointments(api, runtime, world, flow):
    headers = await partner_headers(api, world.app, world.secret)
    assert (await api.call("GET", f"/v1/appointments/{world.org.id}", headers=headers))[0] == 200
    disable(world)
    return await api.call("GET", f"/v1/appointments/{world.org.id}", headers=headers)


async def refused_partner_chart_request(api, runtime, world, flow):
    headers = await partner_headers(api, world.app, world.secret)
    disable(world)
    return await api.call("POST", "/v1/chart-retrieval/requests",
                          {"svc_organization_id": world.org.id, "patient_id": PATIENT}, headers=headers)


async def refused_partner_chart_download(api, runtime, world, flow):
    headers = await partner_headers(api, world.app, world.secret)
    status, _, created = await api.call("POST", "/v1/chart-retrieval/requests",
                                        {"svc_organization_id": world.org.id, "patient_id": PATIENT}, headers=headers)
    assert status == 202, created
    disable(world)
    return await api.call("GET", f"/v1/chart-retrieval/download-url/{created['request_id']}", headers=headers)


@pytest.mark.gen_test
@pytest.mark.parametrize("path", [refused_hub_open, refused_launch, refused_authorize, refused_token_exchange,
                                  refused_userinfo, refused_fhir_api, refused_partner_appointments,
                                  refused_partner_chart_request, refused_partner_chart_download],
                         ids=lambda f: f.__name__)
async def test_a_disabled_installation_is_refused_alike_by_every_path(api, runtime, world, flow, path):
    status, _, body = await path(api, runtime, world, flow)
    assert status == 403 and body["error"] == "application_disabled", body
    assert body["message"].startswith(DISABLED), body


@pytest.mark.gen_test
async def test_a_disabled_app_may_still_enable_itself_and_list_its_clinics(api, world, runtime):
    """The activation operation is how a Disabled app becomes usable, so it is never refused."""
    headers = await partner_headers(api, world.app, world.secret)
    record_platform_verification(runtime, world.app, world.physician)  # the first launch: Disabled
    status, _, body = await api.call("GET", f"/v1/applications/{world.app.id}/organizations", headers=headers)
    assert status == 200 and body[0]["activation_status"] == "Disabled"
    status, _, body = await api.call("PUT", f"/v1/applications/{world.app.id}/organizations/{world.org.id}"
                                            "/activation-status", {"status": "Enabled"}, headers=headers)
    assert status == 200 and body["status"] == "Enabled"
    assert (await api.call("GET", f"/v1/appointments/{world.org.id}", headers=headers))[0] == 200
    set_activation_status(runtime, Installation.find(world.app.id, world.org.id), "Disabled", "test")
    assert (await api.call("GET", f"/v1/appointments/{world.org.id}", headers=headers))[0] == 403


# -- one builder of endpoint URLs ----------------------------------------------------------------

@pytest.mark.gen_test
@pytest.mark.svc_settings(public_url="https://api.clinic-platform.example")
async def test_metadata_oauth_uris_are_the_smart_configuration_endpoints(api, world, runtime):
    assert runtime.settings.public_url != runtime.settings.issuer
    base = f"/fhir/r4/{world.org.id}"
    status, _, metadata = await api.call("GET", f"{base}/metadata")
    assert status == 200, metadata
    status, _, smart = await api.call("GET", f"{base}/.well-known/smart-configuration")
    assert status == 200, smart
    uris = {e["url"]: e["valueUri"] for e in metadata["rest"][0]["security"]["extension"][0]["extension"]}
    assert uris == {"authorize": smart["authorization_endpoint"], "token": smart["token_endpoint"],
                    "introspect": smart["introspection_endpoint"], "revoke": smart["revocation_endpoint"]}
    assert uris["token"] == "https://api.clinic-platform.example/v1/oauth/token"  # CONTRACTS: /v1 at SVC_PUBLIC_URL


# -- one id grammar ------------------------------------------------------------------------------

@pytest.mark.gen_test
async def test_a_launch_is_refused_the_patient_ids_the_fhir_api_refuses(api, world, runtime):
    tokens = await smart_tokens(api, runtime, world)
    fhir = {"Authorization": f"Bearer {tokens['access_token']}"}
    candidates = [PATIENT, "_x", "-x", ".x", "x.y-z_1", "A" * 64, "A" * 65, ".", "..", "pat 1", "pat/1", "pat\n",
                  "pat%1", "pät"]
    outcomes = {}
    for patient_id in candidates:
        query = urllib.parse.urlencode({"_id": patient_id})
        status, _, body = await api.call("GET", f"/fhir/r4/{world.org.id}/Patient?{query}", headers=fhir)
        assert status in (200, 400), (patient_id, body)
        fhir_refuses = status == 400
        status, _, body = await launch(api, world, patient_id)
        assert status in (201, 400), (patient_id, body)
        outcomes[patient_id] = (fhir_refuses, status == 400)
    assert all(fhir == launch_refused for fhir, launch_refused in outcomes.values()), outcomes
    assert not outcomes[PATIENT][0] and outcomes[".."][0] and outcomes["A" * 65][0]


# -- SMART launch context only with launch or launch/patient ---------------------------------------

@pytest.mark.gen_test
@pytest.mark.parametrize("scope, carries", [("openid patient/*.rs", False), ("openid fhirUser user/*.rs", False),
                                            ("openid launch patient/*.rs", True),
                                            ("openid launch/patient patient/*.rs", True)])
async def test_the_patient_context_needs_launch_or_launch_patient(api, world, runtime, scope, carries):
    tokens = await smart_tokens(api, runtime, world, scope=scope, patient_id=PATIENT)
    access = runtime.tokens.verify(tokens["access_token"], PLATFORM_AUDIENCE)
    if carries:
        assert tokens["patient"] == PATIENT and access["patient"] == PATIENT
    else:
        assert "patient" not in tokens and "patient" not in access, (tokens, access)
    assert "patient" not in jwt.get_unverified_claims(tokens["id_token"])
