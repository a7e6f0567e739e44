"""SMART App Launch as a dialect of authorize and token, over real HTTP on both databases: the
per-clinic SMART configuration, `launch` and `aud`, scope narrowing, the patient context, fhirUser,
public clients with PKCE, CORS on the token endpoint, and the hub's appointment rows."""
from __future__ import annotations

import html
import json
import re
import subprocess
import sys
import urllib.parse

import pytest
from jose import jwt

from helpers.environment import ROOT
from helpers.hub import sandbox_signin
from helpers.processes import settings_env
from helpers.worlds import SMART_PATIENT, SmartWorld
from lifecycle.applications import set_smart_scopes
from models.ids import fhir_id
from oauth.pkce import s256
from oauth.tokens import PLATFORM_AUDIENCE

VERIFIER = "smart-" + "v" * 40 + "-._~0123456789"
APP_ORIGIN = SmartWorld.PUBLIC_ORIGIN
PATIENT = SMART_PATIENT


def query_of(location: str) -> dict:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(location).query))


def iss_of(world) -> str:
    return f"http://127.0.0.1:8888/fhir/r4/{world.org.id}"


async def launch(api, world, client_id=None, patient_id=None, token=None) -> dict:
    body = {"client_id": client_id or world.app.client_id}
    if patient_id is not None:
        body["patient_id"] = patient_id
    status, _, answer = await api.call("POST", "/v1/sandbox/launches", body,
                                       headers={"Authorization": f"Bearer {token or world.sandbox_token}"})
    assert status == 201, answer
    return answer


async def authorize(api, app, prefix="/v1", **params):
    query = {"client_id": app.client_id, "redirect_uri": app.redirect_uri, "response_type": "code", **params}
    status, headers, body = await api.call("GET", f"{prefix}/oauth/authorize?{urllib.parse.urlencode(query)}")
    assert status == 302, body
    return query_of(headers["Location"])


async def exchange(api, app, code, secret=None, prefix="/v1", form=False, headers=None, **extra):
    body = {"grant_type": "authorization_code", "client_id": app.client_id, "code": code, **extra}
    if secret is not None:
        body["client_secret"] = secret
    if form:
        return await api.call("POST", f"{prefix}/oauth/token", body=urllib.parse.urlencode(body),
                              headers={"Content-Type": "application/x-www-form-urlencoded", **(headers or {})})
    return await api.call("POST", f"{prefix}/oauth/token", body, headers=headers)


def claims_of(token: str) -> dict:
    return jwt.get_unverified_claims(token)


@pytest.fixture
def public_app(smart_world):
    """A browser-only SMART app: a public client with an allowed origin, installed in the clinic."""
    assert smart_world.public_app.public and smart_world.public_app.client_secret_hash == ""
    return smart_world.public_app


# -- discovery ---------------------------------------------------------------------------------

@pytest.mark.gen_test
async def test_smart_configuration_of_an_existing_clinic(api, world):
    status, headers, doc = await api.call("GET", f"/fhir/r4/{world.org.id}/.well-known/smart-configuration",
                                          headers={"Origin": "https://anywhere.example"})
    assert status == 200, doc
    assert headers["Access-Control-Allow-Origin"] == "*" and "Access-Control-Allow-Credentials" not in headers
    base = "http://127.0.0.1:8888/v1/oauth"
    assert doc["authorization_endpoint"] == f"{base}/authorize" and doc["token_endpoint"] == f"{base}/token"
    assert doc["introspection_endpoint"] == f"{base}/introspect" and doc["revocation_endpoint"] == f"{base}/revoke"
    assert doc["jwks_uri"] == "http://127.0.0.1:8888/.well-known/jwks.json"
    assert doc["issuer"] == "http://127.0.0.1:8888/"
    assert doc["code_challenge_methods_supported"] == ["S256"] and doc["response_types_supported"] == ["code"]
    assert {"authorization_code", "refresh_token"} <= set(doc["grant_types_supported"])
    assert set(doc["token_endpoint_auth_methods_supported"]) == {"client_secret_basic", "client_secret_post", "none",
                                                                 "private_key_jwt"}
    assert doc["token_endpoint_auth_signing_alg_values_supported"] == ["RS384", "ES384"]
    assert {"launch", "launch/patient", "fhirUser", "openid", "profile"} <= set(doc["scopes_supported"])
    assert set(doc["capabilities"]) == {"launch-ehr", "authorize-post", "client-public", "client-confidential-symmetric",
                                        "client-confidential-asymmetric", "permission-v1",
                                        "sso-openid-connect", "context-ehr-patient", "permission-v2",
                                        "permission-patient", "permission-user", "permission-offline",
                                        "permission-online"}
    assert {"offline_access", "online_access"} <= set(doc["scopes_supported"])
    status, _, oidc = await api.call("GET", "/.well-known/openid-configuration")
    assert "none" in oidc["token_endpoint_auth_methods_supported"]
    assert "refresh_token" in oidc["grant_types_supported"]
    for junk in ("org_nope", "%00", "org%00x", "..", "x" * 65, "%2e%2e", "org%0a"):
        status, headers, body = await api.call("GET", f"/fhir/r4/{junk}/.well-known/smart-configuration")
        assert status == 404 and body["error"] == "organization_not_found", (junk, body)
    status, _, body = await api.call("GET", "/fhir/r4/%C3%28/.well-known/smart-configuration")
    assert status == 400, body  # not UTF-8: a clear 4xx, never a lookup


# -- authorize: launch, aud, scope -------------------------------------------------------------

@pytest.mark.gen_test
async def test_the_launch_url_carries_launch_and_iss_and_launch_is_an_alias(api, world):
    answer = await launch(api, world)
    url = query_of(answer["launch_url"])
    assert url["launch"] == url["launch_id"] == answer["launch_id"] and url["iss"] == iss_of(world)
    assert url["svc_organization_id"] == world.org.id
    for prefix in ("/v1", "/os-api/v2"):
        launch_id = (await launch(api, world))["launch_id"]
        result = await authorize(api, world.app, prefix, launch=launch_id, aud=iss_of(world) + "/",
                                 scope="launch openid fhirUser")
        assert "code" in result, result
        status, _, tokens = await exchange(api, world.app, result["code"], world.secret, prefix)
        assert status == 200 and tokens["scope"] == "openid launch fhirUser", tokens
    # the launch is single-use whichever name carries it
    result = await authorize(api, world.app, launch=launch_id)
    assert result["error"] == "invalid_request"
    first, second = (await launch(api, world))["launch_id"], (await launch(api, world))["launch_id"]
    assert (await authorize(api, world.app, launch=first, launch_id=second))["error"] == "invalid_request"


@pytest.mark.gen_test
@pytest.mark.parametrize("aud", ["https://evil.example/fhir/r4/x", "http://127.0.0.1:8888/fhir/r4/org_other",
                                 "http://127.0.0.1:8888/fhir/r4"])
async def test_an_aud_other_than_the_clinics_iss_is_refused(api, world, aud):
    launch_id = (await launch(api, world))["launch_id"]
    result = await authorize(api, world.app, launch=launch_id, aud=aud, state="s1")
    assert result["error"] == "invalid_request" and result["state"] == "s1"
    assert "aud" in result["error_description"]
    # the refused request did not use the launch up
    assert "code" in await authorize(api, world.app, launch=launch_id, aud=iss_of(world))


@pytest.mark.gen_test
async def test_scopes_are_what_the_app_declared_and_asked_for(api, world, runtime):
    launch_id = (await launch(api, world))["launch_id"]
    result = await authorize(api, world.app, launch_id=launch_id, scope="openid patient/Patient.rs")
    _, _, tokens = await exchange(api, world.app, result["code"], world.secret)
    assert tokens["scope"] == "openid patient/Patient.rs"
    assert claims_of(tokens["access_token"])["scope"] == "openid patient/Patient.rs"

    set_smart_scopes(runtime, world.app.id, "launch openid patient/Patient.rs patient/Observation.r")
    asked = ("openid profile launch launch/patient fhirUser patient/*.rs user/Observation.rs "
             "patient/Observation.read patient/Patient.read")
    launch_id = (await launch(api, world))["launch_id"]
    result = await authorize(api, world.app, launch_id=launch_id, scope=asked)
    status, _, tokens = await exchange(api, world.app, result["code"], world.secret)
    assert status == 200, tokens
    # never more than declared: no launch/patient, fhirUser or user/ scope; .rs narrowed to what was declared
    assert tokens["scope"].split() == ["openid", "profile", "launch", "patient/Patient.rs", "patient/Observation.r"]
    assert "fhirUser" not in claims_of(tokens["id_token"])


@pytest.mark.gen_test
@pytest.mark.parametrize("scope", ["admin", "patient/Patient.xyz", "patient/patient.rs", "group/*.rs",
                                   "patient/Patient.rs?category=x", "offline_access", "openid partner_api"])
async def test_nothing_grantable_or_partner_api_is_invalid_scope(api, world, scope):
    launch_id = (await launch(api, world))["launch_id"]
    result = await authorize(api, world.app, launch_id=launch_id, scope=scope)
    assert result["error"] == "invalid_scope", result


@pytest.mark.gen_test
async def test_scopes_not_granted_are_left_out_not_refused(api, world):
    """RFC 6749 3.3, SMART 2.2: the token response's scope says what was granted."""
    launch_id = (await launch(api, world))["launch_id"]
    asked = ("launch openid fhirUser offline_access admin patient/Patient.xyz group/*.rs "
             "patient/Observation.rs?category=x launch/encounter patient/*.read")
    result = await authorize(api, world.app, launch=launch_id, scope=asked)
    status, _, tokens = await exchange(api, world.app, result["code"], world.secret)
    assert status == 200, tokens
    # the default declaration has no offline_access: left out, as every unknown or malformed name
    assert tokens["scope"] == "openid launch fhirUser patient/*.rs" and "refresh_token" not in tokens


# -- token: patient, fhirUser ------------------------------------------------------------------

@pytest.mark.gen_test
async def test_patient_context_reaches_the_token_response_and_the_access_token(api, world, runtime):
    answer = await launch(api, world, patient_id=PATIENT)
    result = await authorize(api, world.app, launch=answer["launch_id"], aud=iss_of(world),
                             scope="launch openid fhirUser patient/*.rs")
    status, _, tokens = await exchange(api, world.app, result["code"], world.secret)
    assert status == 200, tokens
    assert tokens["patient"] == PATIENT and tokens["scope"] == "openid launch fhirUser patient/*.rs"
    access = runtime.tokens.verify(tokens["access_token"], PLATFORM_AUDIENCE)
    assert access["patient"] == PATIENT and access["org"] == world.org.id and access["sub"] == world.physician.id
    assert access["scope"] == tokens["scope"]
    id_claims = claims_of(tokens["id_token"])
    assert id_claims["fhirUser"] == f"{iss_of(world)}/Practitioner/{fhir_id(world.physician.id)}"
    assert "patient" not in id_claims
    # without a patient context: no patient anywhere; without fhirUser granted: no fhirUser claim
    answer = await launch(api, world)
    result = await authorize(api, world.app, launch=answer["launch_id"], scope="openid")
    _, _, tokens = await exchange(api, world.app, result["code"], world.secret)
    assert "patient" not in tokens and "patient" not in claims_of(tokens["access_token"])
    assert "fhirUser" not in claims_of(tokens["id_token"])


@pytest.mark.gen_test
@pytest.mark.parametrize("patient_id", ["", "x" * 65, "../etc", "pat 1", "pat\x00", 42, ["pat_1"], {"a": 1}])
async def test_a_bad_patient_id_is_400(api, world, patient_id):
    status, _, body = await api.call("POST", "/v1/sandbox/launches",
                                     {"client_id": world.app.client_id, "patient_id": patient_id},
                                     headers={"Authorization": f"Bearer {world.sandbox_token}"})
    assert status == 400 and body["error"] == "invalid_request", body


# -- public clients ----------------------------------------------------------------------------

@pytest.mark.gen_test
async def test_public_client_end_to_end_with_pkce_and_no_secret(api, world, public_app, runtime):
    launch_id = (await launch(api, world, public_app.client_id, patient_id=PATIENT))["launch_id"]
    result = await authorize(api, public_app, launch=launch_id, aud=iss_of(world), scope="launch openid patient/*.rs",
                             code_challenge=s256(VERIFIER), code_challenge_method="S256")
    status, headers, tokens = await exchange(api, public_app, result["code"], form=True, code_verifier=VERIFIER,
                                             headers={"Origin": APP_ORIGIN})
    assert status == 200, tokens
    assert headers["Access-Control-Allow-Origin"] == APP_ORIGIN  # the browser app reads its own answer
    assert tokens["patient"] == PATIENT and tokens["scope"] == "openid launch patient/*.rs"
    assert tokens["expires_in"] == runtime.settings.access_token_ttl
    assert runtime.tokens.verify(tokens["access_token"], PLATFORM_AUDIENCE)["client_id"] == public_app.client_id
    # JSON body too, at the other prefix
    launch_id = (await launch(api, world, public_app.client_id))["launch_id"]
    result = await authorize(api, public_app, "/os-api/v2", launch_id=launch_id, code_challenge=s256(VERIFIER),
                             code_challenge_method="S256")
    status, _, tokens = await exchange(api, public_app, result["code"], prefix="/os-api/v2", code_verifier=VERIFIER)
    assert status == 200, tokens
    # a public client may revoke its own token with its client_id alone
    status, _, _ = await api.call("POST", "/v1/oauth/revoke", body=urllib.parse.urlencode(
        {"token": tokens["access_token"], "client_id": public_app.client_id}),
        headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 200


@pytest.mark.gen_test
async def test_public_client_without_pkce_is_refused(api, world, public_app):
    launch_id = (await launch(api, world, public_app.client_id))["launch_id"]
    result = await authorize(api, public_app, launch=launch_id, state="st")
    assert result["error"] == "invalid_request" and "code_challenge" in result["error_description"]
    # a code issued with PKCE still needs the verifier
    result = await authorize(api, public_app, launch=launch_id, code_challenge=s256(VERIFIER),
                             code_challenge_method="S256")
    status, _, body = await exchange(api, public_app, result["code"], form=True)
    assert status == 400 and body["error"] == "invalid_grant"


@pytest.mark.gen_test
async def test_public_client_gets_no_client_credentials_no_secret_and_no_partner_api(api, world, public_app):
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    status, _, body = await api.call("POST", "/v1/oauth/token", body=urllib.parse.urlencode(
        {"grant_type": "client_credentials", "client_id": public_app.client_id}), headers=form)
    assert status == 400 and body["error"] == "unauthorized_client", body
    # a secret presented for a public client is refused, in the body or with Basic
    for secret in ("", "anything", world.secret):
        status, _, body = await api.call("POST", "/v1/oauth/token", body=urllib.parse.urlencode(
            {"grant_type": "client_credentials", "client_id": public_app.client_id, "client_secret": secret}),
            headers=form)
        assert status == 401 and body["error"] == "invalid_client", body
    from helpers.http import basic_auth
    status, _, body = await api.call("POST", "/v1/oauth/token", body="grant_type=client_credentials",
                                     headers={**form, "Authorization": basic_auth(public_app.client_id, "x")})
    assert status == 401 and body["error"] == "invalid_client"
    # introspection needs a client that can authenticate: a public one cannot
    status, _, body = await api.call("POST", "/v1/oauth/introspect", body=urllib.parse.urlencode(
        {"token": "x.y.z", "client_id": public_app.client_id}), headers=form)
    assert status == 401 and body["error"] == "invalid_client"


@pytest.mark.gen_test
async def test_a_confidential_client_without_its_secret_stays_invalid_client(api, world):
    launch_id = (await launch(api, world))["launch_id"]
    result = await authorize(api, world.app, launch_id=launch_id, code_challenge=s256(VERIFIER),
                             code_challenge_method="S256")
    status, _, body = await exchange(api, world.app, result["code"], form=True, code_verifier=VERIFIER)
    assert status == 401 and body["error"] == "invalid_client", body
    status, _, tokens = await exchange(api, world.app, result["code"], world.secret, code_verifier=VERIFIER)
    assert status == 200, tokens  # the failed attempt did not use the code up


@pytest.mark.gen_test
async def test_token_endpoint_preflight_for_the_apps_origin(api, world, public_app):
    headers = {"Origin": APP_ORIGIN, "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "content-type"}
    for prefix in ("/v1", "/os-api/v2"):
        status, h, _ = await api.call("OPTIONS", f"{prefix}/oauth/token", headers=headers)
        assert status == 204 and h["Access-Control-Allow-Origin"] == APP_ORIGIN
        assert "POST" in h["Access-Control-Allow-Methods"] and "Content-Type" in h["Access-Control-Allow-Headers"]
    status, h, _ = await api.call("OPTIONS", "/v1/oauth/token", headers={**headers, "Origin": "https://evil.example"})
    assert status == 204 and "Access-Control-Allow-Origin" not in h


# -- the hub -----------------------------------------------------------------------------------

@pytest.mark.gen_test
async def test_hub_lists_appointments_and_opens_an_app_for_a_patient(api, world, runtime):
    cookie, location = await sandbox_signin(api, runtime, world.physician.id)
    status, _, page = await api.call("GET", location, headers=cookie)
    assert status == 200
    rows = re.findall(r'<tr data-patient-id="([^"]+)">(.*?)</tr>', page, re.S)
    assert rows, page
    patient_id, row = rows[0]
    assert re.search(r'<th scope="row" class="patient-name">[^<]+\w[^<]*</th>', row)
    buttons = re.findall(r'<button[^>]*data-application-id="([^"]+)"[^>]*data-patient-id="([^"]+)"[^>]*>([^<]*)</button>',
                         row)
    assert buttons == [(world.app.id, patient_id, f"Open {world.app.name}")]
    # What hub.js does with that button: a launch with that patient, then the app's flow.
    data = json.loads(html.unescape(re.search(r'<script id="hub-data" type="application/json">(.*?)</script>',
                                              page, re.S).group(1)))
    answer = await launch(api, world, patient_id=patient_id, token=data["sandboxToken"])
    url = query_of(answer["launch_url"])
    assert url["iss"] == iss_of(world) and url["launch"] == answer["launch_id"]
    result = await authorize(api, world.app, launch=url["launch"], aud=url["iss"], scope="launch openid patient/*.rs")
    status, _, tokens = await exchange(api, world.app, result["code"], world.secret)
    assert status == 200 and tokens["patient"] == patient_id, tokens
    # the staff user is no physician: no appointment rows
    cookie, location = await sandbox_signin(api, runtime, world.staff.id)
    _, _, page = await api.call("GET", location, headers=cookie)
    assert "data-patient-id" not in page


@pytest.mark.gen_test
async def test_hub_still_opens_apps_when_the_ehr_is_down(api, world, runtime):
    from models.directory import Organization
    Organization.update(ehr_url="https://ehr.example/test?outage=1").where(Organization.id == world.org.id).execute()
    cookie, location = await sandbox_signin(api, runtime, world.physician.id)
    status, _, page = await api.call("GET", location, headers=cookie)
    assert status == 200 and "data-patient-id" not in page
    assert "EHR did not answer: The sandbox EHR is unavailable" in page
    assert f'id="app-entry-{world.app.id}"' in page


# -- CLI ---------------------------------------------------------------------------------------

def test_cli_public_app_and_smart_scopes(settings, runtime):
    env = settings_env(settings)

    def cli(*args, expect=0):
        result = subprocess.run([sys.executable, "-m", "cli.__main__", *args], env=env, cwd=str(ROOT),
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == expect, result.stderr + result.stdout
        return result

    created = json.loads(cli("apps", "create", "--name", "Viewer", "--redirect-uri", "https://v.example/app",
                             "--launch-url", "https://v.example/launch", "--public",
                             "--smart-scopes", "launch openid patient/Patient.rs", "--json").stdout)
    assert "client_secret" not in created
    assert created["public"] is True and created["token_endpoint_auth_method"] == "none"
    assert created["smart_scopes"] == "launch openid patient/Patient.rs"
    app_id = created["application_id"]
    cli("apps", "secret", "generate-fallback", "--app", app_id, expect=2)  # no secret to rotate
    updated = json.loads(cli("apps", "update", "--app", app_id, "--smart-scopes",
                             "openid user/*.rs offline_access online_access", "--json").stdout)
    assert updated["smart_scopes"] == "openid user/*.rs offline_access online_access"
    assert "client_secret" not in updated
    bad = cli("apps", "update", "--app", app_id, "--smart-scopes", "openid admin", expect=2)
    assert "admin" in bad.stderr
    confidential = json.loads(cli("apps", "update", "--app", app_id, "--no-public", "--json").stdout)
    assert confidential["public"] is False and len(confidential["client_secret"]) >= 32
    again = json.loads(cli("apps", "update", "--app", app_id, "--public", "--json").stdout)
    assert again["public"] is True and "client_secret" not in again
    normal = json.loads(cli("apps", "create", "--name", "Normal", "--redirect-uri", "https://n.example/app",
                            "--launch-url", "https://n.example/launch", "--json").stdout)
    assert normal["client_secret"] and normal["public"] is False
    assert normal["smart_scopes"] == "launch launch/patient openid fhirUser profile patient/*.rs user/*.rs"


# -- console -----------------------------------------------------------------------------------

@pytest.mark.gen_test
async def test_console_shows_a_public_client_without_secret_rotation(http_client, base_url, runtime, world,
                                                                      public_app):
    from helpers.console import ConsoleClient
    from console.accounts import invite_developer
    password = "correct horse battery staple"

    async def signed_in(app_id, email):
        client = ConsoleClient(http_client, base_url)
        _, url, _ = invite_developer(runtime, app_id, email)
        path = urllib.parse.urlsplit(url).path
        assert (await client.get(path)).code == 200
        assert (await client.post(path, {"password": password, "confirm": password})).code == 303
        assert (await client.sign_in(email, password)).code == 303, client.last_html
        return client

    client = await signed_in(public_app.id, "dev@smart.example")
    assert (await client.get(f"/console/apps/{public_app.id}")).code == 200
    page = client.last_html
    assert "Public client (no secret)" in page and "Generate fallback secret" not in page
    assert 'id="smart-scopes">launch launch/patient openid fhirUser profile patient/*.rs user/*.rs<' in page
    response = await client.post(f"/console/apps/{public_app.id}/secret/fallback")
    assert 400 <= response.code < 500  # nothing to rotate, a clear refusal
    client = await signed_in(world.app.id, "dev@test.example")
    await client.get(f"/console/apps/{world.app.id}")
    assert "Confidential client (client secret)" in client.last_html
    assert "Generate fallback secret" in client.last_html
