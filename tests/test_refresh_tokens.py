"""SMART refresh tokens (issue 34) over real HTTP on both databases: the launch as the SMART App
Launch 2.2 test kit runs it (`launch openid fhirUser offline_access patient/*.read`), refresh with
and without `scope`, narrowing, widening refused, rotation and replay detection (the grant and its
access tokens end, on the FHIR API too), each way a grant ends, introspection, public clients,
online_access bound to the hub session, and the audit trail from a disclosure to its launch."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from jose import jwt

from helpers.environment import ROOT
from helpers.processes import settings_env
from helpers.smart import KIT_SCOPE, SmartClient, iss_of
from models.application import DEFAULT_SMART_SCOPES, Installation
from models.disclosures import DisclosureRecord
from models.refresh import RefreshToken, SmartGrant
from models.ids import fhir_id

REFRESH_SCOPES = DEFAULT_SMART_SCOPES + " offline_access online_access"


@pytest.fixture
def smart(runtime, world):
    """`world` with SMART apps declaring offline_access and online_access."""
    return world.smart(runtime, REFRESH_SCOPES)


@pytest.fixture
def confidential(api, smart):
    return SmartClient(api, smart.app, smart.secret, smart.world.sandbox_token, smart.org.id)


@pytest.fixture
def public(api, smart):
    return SmartClient(api, smart.public_app, None, smart.world.sandbox_token, smart.org.id)


def claims_of(token: str) -> dict:
    return jwt.get_unverified_claims(token)


def cli(settings, *args) -> dict | list:
    result = subprocess.run([sys.executable, "-m", "cli.__main__", *args], env=settings_env(settings), cwd=str(ROOT),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr + result.stdout
    return json.loads(result.stdout)


# -- the certification kit's launch, and refresh --------------------------------------------------

@pytest.mark.gen_test(timeout=60)
async def test_kit_launch_gets_a_refresh_token_and_refresh_keeps_the_launch_context(confidential, smart, runtime):
    first = await confidential.tokens(KIT_SCOPE)
    assert first["scope"] == "openid launch fhirUser offline_access patient/*.rs", first
    assert first["patient"] == confidential.patient and first["refresh_token"] and "." not in first["refresh_token"]
    fhir_user = f"{iss_of(smart.org.id)}/Practitioner/{fhir_id(smart.physician.id)}"
    assert claims_of(first["id_token"])["fhirUser"] == fhir_user
    stored = RefreshToken.get()
    assert stored.token_hash != first["refresh_token"] and first["refresh_token"] not in stored.token_hash

    status, second = await confidential.refresh(first["refresh_token"])
    assert status == 200, second
    assert second["scope"] == first["scope"] and second["patient"] == confidential.patient
    assert second["token_type"] == "Bearer" and second["expires_in"] == runtime.settings.access_token_ttl
    assert second["refresh_token"] not in (None, first["refresh_token"])
    id_claims = claims_of(second["id_token"])
    assert id_claims["fhirUser"] == fhir_user and id_claims["sub"] == smart.physician.id
    assert id_claims["aud"] == smart.app.client_id
    access = claims_of(second["access_token"])
    assert access["patient"] == confidential.patient and access["scope"] == first["scope"]
    assert access["jti"] != claims_of(first["access_token"])["jti"]
    status, patient = await confidential.read_patient(second["access_token"])
    assert status == 200 and patient["id"] == confidential.patient, patient

    # introspection: the launch context and exactly the token response's scope; refresh tokens too
    seen = await confidential.introspect(second["access_token"], smart.secret)
    assert seen["active"] and seen["patient"] == confidential.patient and seen["fhirUser"] == fhir_user
    assert seen["scope"] == second["scope"]
    seen = await confidential.introspect(second["refresh_token"], smart.secret)
    assert seen["active"] is True and seen["client_id"] == smart.app.client_id and seen["scope"] == first["scope"]
    assert abs(seen["exp"] - (runtime.clock.time() + runtime.settings.offline_access_ttl)) < 5
    assert (await confidential.introspect(first["refresh_token"], smart.secret)) == {"active": False}  # spent


@pytest.mark.gen_test(timeout=60)
async def test_json_body_and_the_os_api_v2_prefix(api, smart):
    client = SmartClient(api, smart.app, smart.secret, smart.world.sandbox_token, smart.org.id, prefix="/os-api/v2")
    tokens = await client.tokens()
    status, _, body = await api.call("POST", "/os-api/v2/oauth/token", {
        "grant_type": "refresh_token", "refresh_token": tokens["refresh_token"], "client_id": smart.app.client_id,
        "client_secret": smart.secret})
    assert status == 200 and body["refresh_token"] and body["patient"] == client.patient, body


@pytest.mark.gen_test(timeout=60)
async def test_scope_may_narrow_never_widen(confidential, smart):
    tokens = await confidential.tokens("launch openid fhirUser offline_access patient/*.rs")
    status, body = await confidential.refresh(tokens["refresh_token"], scope="user/*.rs")
    assert status == 400 and body["error"] == "invalid_scope", body
    status, body = await confidential.refresh(tokens["refresh_token"], scope="launch openid patient/*.rs profile")
    assert status == 400 and body["error"] == "invalid_scope", body
    # a refused scope does not spend the token
    status, narrow = await confidential.refresh(tokens["refresh_token"], scope="launch patient/Patient.rs")
    assert status == 200, narrow
    assert narrow["scope"] == "launch patient/Patient.rs" and narrow["patient"] == confidential.patient
    assert "id_token" not in narrow  # openid not asked for this access token
    status, body = await confidential.read_patient(narrow["access_token"])
    assert status == 200, body
    # the grant keeps its scope: the next refresh without `scope` gets all of it back
    status, again = await confidential.refresh(narrow["refresh_token"])
    assert status == 200 and again["scope"] == tokens["scope"] and again["id_token"], again


@pytest.mark.gen_test(timeout=60)
async def test_a_refresh_narrowed_without_fhir_user_no_longer_reads_the_users_practitioner(api, confidential,
                                                                                          smart, runtime):
    """`fhirUser` alone reads the user's own Practitioner (no Practitioner scope); a refresh narrowed
    without it carries no `fhirUser` (ID token, introspection) and reads it no more, nor does a token
    of an app that no longer declares `fhirUser`."""
    from lifecycle.applications import set_smart_scopes
    declared = "launch openid fhirUser offline_access patient/Patient.rs"
    set_smart_scopes(runtime, smart.app.id, declared)
    tokens = await confidential.tokens(declared)
    fhir_user = f"{iss_of(smart.org.id)}/Practitioner/{fhir_id(smart.physician.id)}"
    assert claims_of(tokens["id_token"])["fhirUser"] == fhir_user
    path = f"/fhir/r4/{smart.org.id}/Practitioner/{fhir_id(smart.physician.id)}"

    async def read(access_token: str) -> tuple[int, dict]:
        status, _, body = await api.call("GET", path, headers={"Authorization": f"Bearer {access_token}",
                                                               "Accept": "application/fhir+json"})
        return status, body

    status, body = await read(tokens["access_token"])
    assert status == 200 and body["id"] == fhir_id(smart.physician.id), body
    status, kept = await confidential.refresh(tokens["refresh_token"])
    assert status == 200 and claims_of(kept["id_token"])["fhirUser"] == fhir_user, kept
    assert (await read(kept["access_token"]))[0] == 200
    status, narrow = await confidential.refresh(kept["refresh_token"], scope="launch openid patient/Patient.rs")
    assert status == 200 and narrow["scope"] == "launch openid patient/Patient.rs", narrow
    assert "fhirUser" not in claims_of(narrow["id_token"]) and "fhirUser" not in claims_of(narrow["access_token"])
    assert "fhirUser" not in await confidential.introspect(narrow["access_token"], smart.secret)
    status, body = await read(narrow["access_token"])
    assert status == 403 and body["issue"][0]["code"] == "forbidden", body
    # The grant keeps `fhirUser`: the next refresh without `scope` reads it again...
    status, again = await confidential.refresh(narrow["refresh_token"])
    assert status == 200 and claims_of(again["id_token"])["fhirUser"] == fhir_user, again
    assert (await read(again["access_token"]))[0] == 200
    # ...until the app no longer declares `fhirUser`: its live token reads it no more, at once.
    set_smart_scopes(runtime, smart.app.id, "launch openid offline_access patient/Patient.rs")
    status, body = await read(again["access_token"])
    assert status == 403 and body["issue"][0]["code"] == "forbidden", body


@pytest.mark.gen_test(timeout=60)
async def test_a_replayed_refresh_token_revokes_the_whole_grant(confidential, smart, settings):
    tokens = await confidential.tokens()
    status, second = await confidential.refresh(tokens["refresh_token"])
    assert status == 200
    assert (await confidential.read_patient(second["access_token"]))[0] == 200
    status, body = await confidential.refresh(tokens["refresh_token"])  # the spent one: a thief or the app
    assert status == 400 and body["error"] == "invalid_grant" and "already used" in body["error_description"]
    status, body = await confidential.refresh(second["refresh_token"])  # the family is dead too
    assert status == 400 and body["error"] == "invalid_grant", body
    for access in (tokens["access_token"], second["access_token"]):
        status, outcome = await confidential.read_patient(access)
        assert status == 401 and outcome["resourceType"] == "OperationOutcome", outcome
    assert (await confidential.introspect(second["access_token"], smart.secret)) == {"active": False}
    assert SmartGrant.get().revoked_reason == "refresh_token_replayed"
    assert cli(settings, "grants", "list", "--json") == []


@pytest.mark.gen_test(timeout=60)
async def test_a_refresh_token_is_bound_to_its_client(confidential, public, smart):
    tokens = await confidential.tokens()
    status, body = await public.refresh(tokens["refresh_token"])  # another client presents it
    assert status == 400 and body["error"] == "invalid_grant", body
    confidential.secret = "wrong-secret"
    status, body = await confidential.refresh(tokens["refresh_token"])
    assert status == 401 and body["error"] == "invalid_client", body
    confidential.secret = smart.secret
    status, body = await confidential.refresh(tokens["refresh_token"])  # untouched by those attempts
    assert status == 200, body


@pytest.mark.gen_test(timeout=60)
async def test_public_client_refreshes_with_client_id_and_needs_pkce(public, smart):
    refused = await public.authorize(pkce=False)
    assert refused["error"] == "invalid_request" and "PKCE" in refused["error_description"], refused
    tokens = await public.tokens()
    assert tokens["refresh_token"] and tokens["patient"] == public.patient
    status, body = await public.refresh(tokens["refresh_token"])
    assert status == 200 and body["refresh_token"] != tokens["refresh_token"], body
    status, _ = await public.read_patient(body["access_token"])
    assert status == 200


@pytest.mark.gen_test(timeout=60)
async def test_a_confidential_apps_grants_end_when_it_is_made_public(confidential, smart, runtime, api):
    """A confidential app's refresh token is useless without its secret. Made a public client (the
    console's checkbox, `apps update --public`), the app's backend that holds those tokens can no
    longer present its secret (a public client has none): left live, they would refresh for whoever
    names the public client_id alone, a thief included. So its grants end, their access tokens too."""
    from lifecycle.applications import set_public
    tokens = await confidential.tokens()
    set_public(runtime, smart.app.id, True)
    thief = SmartClient(api, smart.app, None, smart.world.sandbox_token, smart.org.id)  # client_id alone
    status, body = await thief.refresh(tokens["refresh_token"])
    assert (status, body["error"]) == (400, "invalid_grant"), body
    assert SmartGrant.get().revoked_reason == "client_made_public"
    assert (await thief.read_patient(tokens["access_token"]))[0] == 401
    set_public(runtime, smart.app.id, False)  # confidential again: it revives nothing
    status, body = await thief.refresh(tokens["refresh_token"])
    assert status == 401 and body["error"] == "invalid_client", body


@pytest.mark.gen_test(timeout=60)
async def test_which_launches_get_a_refresh_token(confidential, smart, runtime):
    # both asked: one per grant, offline (the app declared both)
    both = await confidential.tokens("launch openid offline_access online_access patient/*.rs")
    assert both["scope"] == "openid launch offline_access patient/*.rs" and both["refresh_token"]
    assert SmartGrant.get().access == "offline"
    # not declared: left out, no refresh token
    from lifecycle.applications import set_smart_scopes
    set_smart_scopes(runtime, smart.app.id, DEFAULT_SMART_SCOPES)
    plain = await confidential.tokens(KIT_SCOPE)
    assert plain["scope"] == "openid launch fhirUser patient/*.rs" and "refresh_token" not in plain
    # the spec's own SDK flow (launch_id): its access token "cannot be refreshed"
    set_smart_scopes(runtime, smart.app.id, REFRESH_SCOPES)
    sdk = await confidential.tokens("openid offline_access", launch_param="launch_id")
    assert sdk["scope"] == "openid" and "refresh_token" not in sdk


@pytest.mark.gen_test(timeout=60)
async def test_bad_refresh_requests_are_clear_4xx(api, confidential, smart):
    tokens = await confidential.tokens()
    for form, status, error in (
            ({"grant_type": "refresh_token"}, 400, "invalid_request"),                       # no refresh_token
            ({"grant_type": "refresh_token", "refresh_token": "x" * 9000}, 400, "invalid_request"),
            ({"grant_type": "refresh_token", "refresh_token": "not-a-token"}, 400, "invalid_grant"),
            ({"grant_type": "refresh_token", "refresh_token": tokens["access_token"]}, 400, "invalid_grant"),
            ({"grant_type": "refresh_token", "refresh_token": tokens["refresh_token"], "scope": "a\x00b"}, 400,
             "invalid_request")):
        answer_status, body = await confidential.token(form)
        assert (answer_status, body["error"]) == (status, error), (form, body)
    for value in (42, ["x"], {"a": 1}, None):
        answer, _, body = await api.call("POST", "/v1/oauth/token", {
            "grant_type": "refresh_token", "refresh_token": value, "client_id": smart.app.client_id,
            "client_secret": smart.secret})
        assert answer == 400 and body["error"] == "invalid_request", (value, body)
    status, body = await confidential.refresh(tokens["refresh_token"])  # none of that spent it
    assert status == 200, body


# -- how a grant ends -------------------------------------------------------------------------

@pytest.mark.gen_test(timeout=60)
async def test_rfc7009_revoking_the_refresh_token_ends_the_grant(public, confidential, smart):
    tokens = await public.tokens()
    assert await public.revoke(tokens["refresh_token"]) == 200
    status, body = await public.refresh(tokens["refresh_token"])
    assert status == 400 and body["error"] == "invalid_grant", body
    assert (await public.read_patient(tokens["access_token"]))[0] == 401
    # another client's refresh token: the same 200, and nothing changes (RFC 7009 2.2)
    other = await confidential.tokens()
    assert await public.revoke(other["refresh_token"]) == 200
    assert (await confidential.refresh(other["refresh_token"]))[0] == 200


@pytest.mark.gen_test(timeout=60)
@pytest.mark.parametrize("how", ["disabled", "uninstalled", "app_deleted", "user_deleted"])
async def test_the_grant_ends_with_the_installation_the_app_or_the_user(confidential, smart, runtime, how):
    tokens = await confidential.tokens()
    installation = Installation.find(smart.app.id, smart.org.id)
    if how == "disabled":
        from lifecycle.activation import set_activation_status
        Installation.update(activation_status="Enabled").where(Installation.id == installation.id).execute()
        set_activation_status(runtime, installation, "Disabled", "test")
        set_activation_status(runtime, installation, "Enabled", "test")  # re-enabling revives nothing
    elif how == "uninstalled":
        installation.delete_instance()
    elif how == "app_deleted":
        from lifecycle.applications import delete_application
        delete_application(runtime, smart.app.id)
    else:
        smart.physician.delete_instance(recursive=True)
    status, body = await confidential.refresh(tokens["refresh_token"])
    expected = ("invalid_client", 401) if how == "app_deleted" else ("invalid_grant", 400)
    assert (body["error"], status) == expected, body
    if how == "disabled":
        assert SmartGrant.get().revoked_reason == "installation_disabled"
    else:
        assert SmartGrant.select().count() == 0 and RefreshToken.select().count() == 0


@pytest.mark.gen_test(timeout=60)
async def test_the_first_sdk_initialization_disabling_the_installation_ends_its_grants(confidential, smart, runtime,
                                                                                       api):
    """A grant made before the app's first SDK initialization in the clinic (no status yet, so the app
    opens) ends when the platform's verification moves the installation to `Disabled`, as every
    `Disabled` does: enabling the app afterwards revives none."""
    from lifecycle.activation import set_activation_status
    tokens = await confidential.tokens()
    assert Installation.find(smart.app.id, smart.org.id).activation_status is None
    status, _, seen = await api.call("POST", "/v1/oauth/introspect", {"token": tokens["access_token"]},
                                     headers={"Authorization": f"Bearer {smart.world.sandbox_token}"})
    assert status == 200 and seen["active"] is True  # the platform's verification: the first SDK initialization
    installation = Installation.find(smart.app.id, smart.org.id)
    assert installation.activation_status == "Disabled"
    assert SmartGrant.get().revoked_reason == "installation_disabled"
    set_activation_status(runtime, installation, "Enabled", "test")
    status, body = await confidential.refresh(tokens["refresh_token"])
    assert (status, body["error"]) == (400, "invalid_grant"), body
    assert (await confidential.read_patient(tokens["access_token"]))[0] == 401


@pytest.mark.gen_test(timeout=60)
@pytest.mark.parametrize("refresh_scope", ["offline_access", "online_access"])
async def test_the_grant_ends_when_the_app_no_longer_declares_its_refresh_scope(confidential, smart, runtime,
                                                                                refresh_scope):
    """The developer takes `offline_access` (or `online_access`) out of the app's SMART scopes: the
    grants it was the basis of end at their next refresh (invalid_grant), and declaring it again
    revives none of them."""
    from lifecycle.applications import set_smart_scopes
    tokens = await confidential.tokens(f"launch openid {refresh_scope} patient/*.rs")
    assert refresh_scope in tokens["scope"].split() and tokens["refresh_token"], tokens
    status, body = await confidential.refresh(tokens["refresh_token"])
    assert status == 200, body
    set_smart_scopes(runtime, smart.app.id, " ".join(n for n in REFRESH_SCOPES.split() if n != refresh_scope))
    assert await confidential.introspect(body["refresh_token"], smart.secret) == {"active": False}
    status, refused = await confidential.refresh(body["refresh_token"])
    assert (status, refused["error"]) == (400, "invalid_grant"), refused
    assert refresh_scope in refused["error_description"]
    assert SmartGrant.get().revoked_reason == "refresh_scope_undeclared"
    set_smart_scopes(runtime, smart.app.id, REFRESH_SCOPES)
    status, again = await confidential.refresh(body["refresh_token"])
    assert (status, again["error"]) == (400, "invalid_grant"), again


@pytest.mark.gen_test(timeout=90)
async def test_cli_grants_list_and_revoke(confidential, public, smart, settings, world):
    first = await confidential.tokens()
    await public.tokens()
    await confidential.tokens()
    listed = cli(settings, "grants", "list", "--app", smart.app.id, "--json")
    assert len(listed) == 2 and set(listed[0]) == {"grant_id", "application_id", "client_id", "user_id",
                                                    "organization_id", "scope", "access", "created_at", "expires_at"}
    assert listed[0]["access"] == "offline" and listed[0]["user_id"] == smart.physician.id
    assert listed[0]["organization_id"] == smart.org.id and listed[0]["scope"] == first["scope"]
    assert listed[0]["expires_at"].endswith("Z")
    assert len(cli(settings, "grants", "list", "--user", smart.physician.id, "--org", smart.org.id, "--json")) == 3
    assert cli(settings, "grants", "list", "--user", world.staff.id, "--json") == []
    assert cli(settings, "grants", "revoke", "--grant", listed[0]["grant_id"], "--json") == {"revoked": 1}
    status, body = await confidential.refresh(first["refresh_token"])
    assert status == 400 and body["error"] == "invalid_grant"
    assert (await confidential.read_patient(first["access_token"]))[0] == 401
    assert cli(settings, "grants", "revoke", "--app", smart.app.id, "--json") == {"revoked": 1}
    assert cli(settings, "grants", "revoke", "--user", smart.physician.id, "--json") == {"revoked": 1}
    assert cli(settings, "grants", "list", "--json") == []


@pytest.mark.gen_test(timeout=60)
async def test_online_access_lives_no_longer_than_the_hub_session(api, smart, runtime):
    from hub.sandbox import end_sandbox_session, issue_sandbox_token, open_sandbox_session, sandbox_session_of
    session_id = open_sandbox_session(runtime, smart.physician)
    _, session = sandbox_session_of(runtime, session_id)
    from hub.sandbox import signed_in_at
    hub_token = issue_sandbox_token(runtime, smart.physician, signed_in_at(session))  # as the hub page does
    client = SmartClient(api, smart.app, smart.secret, hub_token, smart.org.id)
    tokens = await client.tokens("launch openid online_access patient/*.rs")
    assert "online_access" in tokens["scope"].split() and tokens["refresh_token"]
    grant = SmartGrant.get()
    assert grant.access == "online" and grant.expires_at <= session.expires_at
    status, second = await client.refresh(tokens["refresh_token"])
    assert status == 200, second
    end_sandbox_session(runtime, session_id)  # the clinician signs out of the hub
    status, body = await client.refresh(second["refresh_token"])
    assert status == 400 and body["error"] == "invalid_grant", body


@pytest.mark.gen_test(timeout=60)
async def test_online_access_from_a_hub_session_already_ended_never_refreshes(api, smart, runtime):
    """The hub's sandbox token outlives a sign-out (30 minutes): a launch made with it afterwards (a
    hub page left open in another tab) came from a session that has ended, so its online grant has
    ended too. It was bound to no session at all and refreshed for SVC_ONLINE_ACCESS_TTL (12 h)."""
    from hub.sandbox import end_sandbox_session, issue_sandbox_token, open_sandbox_session, sandbox_session_of
    from hub.sandbox import signed_in_at
    session_id = open_sandbox_session(runtime, smart.physician)
    _, session = sandbox_session_of(runtime, session_id)
    hub_token = issue_sandbox_token(runtime, smart.physician, signed_in_at(session))  # as the hub page does
    end_sandbox_session(runtime, session_id)  # the clinician signs out; the hub page's token still launches
    client = SmartClient(api, smart.app, smart.secret, hub_token, smart.org.id)
    tokens = await client.tokens("launch openid online_access patient/*.rs")
    status, body = await client.refresh(tokens["refresh_token"])
    assert status == 400 and body["error"] == "invalid_grant", body


@pytest.mark.gen_test(timeout=60)
async def test_offline_access_lifetime_is_per_app_and_ends(confidential, smart, runtime, settings, clock):
    updated = cli(settings, "apps", "update", "--app", smart.app.id, "--offline-access-ttl", "3600", "--json")
    assert updated["offline_access_ttl"] == 3600
    tokens = await confidential.tokens()
    grant = SmartGrant.get()
    assert abs((grant.expires_at - grant.created_at).total_seconds() - 3600) < 1
    clock.advance(3601)
    status, body = await confidential.refresh(tokens["refresh_token"])
    assert status == 400 and body["error"] == "invalid_grant", body
    assert cli(settings, "apps", "update", "--app", smart.app.id, "--offline-access-ttl", "default",
               "--json")["offline_access_ttl"] == "default"


# -- audit -----------------------------------------------------------------------------------------

@pytest.mark.gen_test(timeout=60)
async def test_every_disclosure_of_a_refreshed_token_leads_to_its_launch(confidential, smart):
    launch_id = await confidential.launch()
    answer = await confidential.authorize(launch_id=launch_id)
    from helpers.smart import VERIFIER
    status, tokens = await confidential.token({"grant_type": "authorization_code", "code": answer["code"],
                                               "code_verifier": VERIFIER})
    assert status == 200, tokens
    status, refreshed = await confidential.refresh(tokens["refresh_token"])
    assert status == 200
    assert (await confidential.read_patient(refreshed["access_token"]))[0] == 200
    record = DisclosureRecord.select().order_by(DisclosureRecord.seq.desc()).get()
    assert record.jti == claims_of(refreshed["access_token"])["jti"]
    # the auditor's join (docs/audit.md): disclosure jti -> refresh_token.access_jti -> grant -> launch
    grant = SmartGrant.get_by_id(RefreshToken.get(RefreshToken.access_jti == record.jti).grant_id)
    assert grant.launch_id == launch_id and grant.user_id == record.user_id


# -- the deny-list in Redis ----------------------------------------------------------------------

@pytest.mark.gen_test(timeout=60)
async def test_a_replay_denies_the_grants_access_tokens_in_redis(confidential, runtime, redis_namespace):
    from helpers.environment import REDIS_URL
    from oauth.denylist import RedisDenyList
    runtime.denylist = RedisDenyList(REDIS_URL, redis_namespace, runtime.clock)
    tokens = await confidential.tokens()
    status, second = await confidential.refresh(tokens["refresh_token"])
    assert status == 200 and (await confidential.read_patient(second["access_token"]))[0] == 200
    status, body = await confidential.refresh(tokens["refresh_token"])
    assert status == 400 and body["error"] == "invalid_grant", body
    assert (await confidential.read_patient(second["access_token"]))[0] == 401


@pytest.mark.gen_test(timeout=60)
async def test_revocation_with_the_deny_list_down_is_503_and_revokes_later(confidential, runtime):
    from helpers.processes import free_port
    from oauth.denylist import RedisDenyList
    tokens = await confidential.tokens()
    status, second = await confidential.refresh(tokens["refresh_token"])
    assert status == 200
    working, runtime.denylist = runtime.denylist, RedisDenyList(f"redis://127.0.0.1:{free_port()}/0", "nowhere",
                                                                 runtime.clock)
    status, body = await confidential.refresh(tokens["refresh_token"])  # a replay, but nothing can be denied
    assert status == 503, body
    assert SmartGrant.get().revoked_at is None  # not half-revoked: nothing was marked
    runtime.denylist = working
    status, body = await confidential.refresh(tokens["refresh_token"])  # the replay is still seen
    assert status == 400 and body["error"] == "invalid_grant"
    assert (await confidential.read_patient(second["access_token"]))[0] == 401
