"""A Python client generated from `/v1/openapi.json` (openapi-python-client, pinned in setup.py)
calls every operation of the document against the running service (both databases).

Every response also goes through tests/helpers/openapi.py (an httpx response hook), like the
rest of the suite's, and the test fails if the document gains an operation this test does not call.
"""
from __future__ import annotations

import base64
import importlib
import json
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from connectors.sandbox import patient_panel
from helpers.openapi import check_response
from partner_api.openapi import openapi_document

PACKAGE = "svc_auth_client"


@pytest.fixture(scope="session")
def generated_client(tmp_path_factory):
    """Generate the client package from the document and import it."""
    work = tmp_path_factory.mktemp("openapi-client")
    (work / "openapi.json").write_text(json.dumps(openapi_document("http://127.0.0.1")))
    (work / "config.yaml").write_text("post_hooks: []\n")  # no formatter run: nothing else needed
    generator = Path(sys.executable).with_name("openapi-python-client")
    result = subprocess.run([str(generator), "generate", "--path", str(work / "openapi.json"), "--config",
                             str(work / "config.yaml"), "--meta", "none", "--output-path", str(work / PACKAGE)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Warning" not in result.stdout + result.stderr, result.stdout + result.stderr  # nothing skipped
    sys.path.insert(0, str(work))
    try:
        package = importlib.import_module(PACKAGE)
        # Every generated module imports (a shared JSON/form schema once made the token module fail).
        for module in sorted((work / PACKAGE / "api").rglob("*.py")):
            importlib.import_module(".".join(module.relative_to(work).with_suffix("").parts))
        yield package
    finally:
        sys.path.remove(str(work))


class Calls:
    """Calls operations by operationId; records which ones ran, checks each response's contract."""

    def __init__(self, package, base_url: str):
        self.package, self.base_url, self.called = package, base_url, set()
        self.modules = {}
        for path, item in openapi_document("http://127.0.0.1")["paths"].items():
            for operation in item.values():
                tag = operation["tags"][0]
                self.modules[operation["operationId"]] = importlib.import_module(
                    f"{PACKAGE}.api.{tag}.{operation['operationId']}")

    async def _check(self, response):
        await response.aread()
        check_response(response.request.method, str(response.request.url), response.status_code, response.headers,
                       response.content)

    def client(self, token: str | None = None, prefix: str = "Bearer"):
        hooks = {"event_hooks": {"response": [self._check]}}
        if token is None:
            return self.package.Client(base_url=self.base_url, httpx_args=hooks)
        return self.package.AuthenticatedClient(base_url=self.base_url, token=token, prefix=prefix, httpx_args=hooks)

    async def __call__(self, operation_id: str, client, expect: int, **kwargs):
        async with client as http:
            response = await self.modules[operation_id].asyncio_detailed(client=http, **kwargs)
        assert response.status_code == expect, (operation_id, response.status_code, response.content[:300])
        self.called.add(operation_id)
        return response


@pytest.mark.gen_test(timeout=60)
async def test_generated_client_calls_every_operation(generated_client, http_server, base_url, world, runtime):
    m = importlib.import_module(f"{PACKAGE}.models")
    call = Calls(generated_client, base_url)
    application, secret, org = world.app, world.secret, world.org
    basic = base64.b64encode(f"{application.client_id}:{secret}".encode()).decode()

    async def code_from_launch(prefix: str, post: bool = False) -> str:
        launch = (await call("sandbox_launch_create", call.client(world.sandbox_token), 201,
                             body=m.SandboxLaunchRequest(client_id=application.client_id))).parsed
        assert isinstance(launch, m.SandboxLaunch) and launch.expires_in > 0
        fields = dict(client_id=application.client_id, redirect_uri=application.redirect_uri,
                      launch_id=launch.launch_id, response_type="code", state="st")
        if post:  # the same parameters as a form body (OIDC Core 3.1.2.1); 303 to redirect_uri
            body_model = m.OauthAuthorizePostBody if prefix == "" else m.OsApiV2OauthAuthorizePostBody
            response = await call(prefix + "oauth_authorize_post", call.client(), 303, body=body_model(**fields))
        else:
            response = await call(prefix + "oauth_authorize", call.client(), 302, **fields)
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(response.headers["Location"]).query)
        assert query["state"] == ["st"]
        return query["code"][0]

    # Both launches and both flows before the platform's first verification (introspection), which
    # disables a new installation.
    code, code_v2 = await code_from_launch(""), await code_from_launch("os_api_v2_")
    assert await code_from_launch("", post=True) and await code_from_launch("os_api_v2_", post=True)

    # /v1: JSON token body with the secret in it; userinfo both ways; the platform's introspection.
    tokens = (await call("oauth_token", call.client(), 200, body=m.TokenRequestJson(
        grant_type=m.TokenRequestJsonGrantType.AUTHORIZATION_CODE, code=code, client_id=application.client_id,
        client_secret=secret, redirect_uri=application.redirect_uri))).parsed
    assert isinstance(tokens, m.TokenResponse) and tokens.id_token
    for operation in ("oauth_userinfo", "oauth_userinfo_post"):
        info = (await call(operation, call.client(tokens.access_token), 200)).parsed
        assert info.sub == world.physician.id
    v1_tokens = tokens

    # /os-api/v2: form token body with HTTP Basic client authentication.
    tokens = (await call("os_api_v2_oauth_token", call.client(basic, "Basic"), 200, body=m.TokenRequestForm(
        grant_type=m.TokenRequestFormGrantType.AUTHORIZATION_CODE, code=code_v2))).parsed
    for operation in ("os_api_v2_oauth_userinfo", "os_api_v2_oauth_userinfo_post"):
        assert (await call(operation, call.client(tokens.access_token), 200)).parsed.sub == world.physician.id
    verdict = (await call("os_api_v2_oauth_introspect", call.client(basic, "Basic"), 200,
                          body=m.OsApiV2OauthIntrospectBody(token=tokens.access_token))).parsed
    assert verdict.active is True
    await call("os_api_v2_oauth_revoke", call.client(basic, "Basic"), 200,
               body=m.OsApiV2OauthRevokeBody(token=tokens.access_token))

    # Last of the user flows: the platform's first verification leaves the installation Disabled
    # (codes, tokens and userinfo of a Disabled app are refused: lifecycle/activation.py).
    tokens = v1_tokens
    verdict = (await call("oauth_introspect", call.client(world.sandbox_token), 200,
                          body=m.OauthIntrospectBody(token=tokens.access_token))).parsed
    assert verdict.active is True
    await call("oauth_revoke", call.client(basic, "Basic"), 200, body=m.OauthRevokeBody(token=tokens.access_token))
    await call("oauth_userinfo", call.client(tokens.access_token), 401)  # revoked

    # The partner API with a client-credentials token (the oauth2 scheme's tokenUrl operation).
    cc = (await call("oauth_token", call.client(basic, "Basic"), 200, body=m.TokenRequestForm(
        grant_type=m.TokenRequestFormGrantType.CLIENT_CREDENTIALS))).parsed
    partner = lambda: call.client(cc.access_token)  # noqa: E731  (a client is closed after each call)
    orgs = (await call("organizations", partner(), 200, application_id=application.id)).parsed
    assert [o.id for o in orgs] == [org.id]
    users = (await call("users", partner(), 200, application_id=application.id, organization_id=org.id)).parsed
    assert {u.id for u in users} == {world.physician.id, world.staff.id}
    status = (await call("activation_status", partner(), 200, application_id=application.id, organization_id=org.id,
                         body=m.ActivationStatusRequest(status=m.ActivationStatusRequestStatus.ENABLED))).parsed
    assert status.status == m.ActivationStatusStatus.ENABLED
    month = runtime.clock.now().strftime("%Y-%m")
    ledger = (await call("billing", partner(), 200, application_id=application.id, month=month)).parsed
    assert ledger.application_id == application.id
    page = (await call("appointments", partner(), 200, svc_organization_id="123456789", limit=5)).parsed
    assert page.limit == 5 and len(page.appointments) <= 5
    invitation = (await call("invitations", partner(), 201, body=m.InvitationRequest(
        email="new.doc@example.com", given_name="New", family_name="Doc", organization_name="New Clinic"))).parsed
    token = urllib.parse.urlsplit(invitation.invitation_url).path.rsplit("/", 1)[-1]
    await call("invitation_accept", call.client(), 302, token=token)
    created = (await call("chart_request_create", partner(), 202, body=m.ChartRequestCreate(
        svc_organization_id=org.id, patient_id=patient_panel(org.id)[0].id))).parsed
    assert created.request_id
    test_request = "a1b2c3d4e5f6a7b8c9d0"  # the test-mode request: always ready
    chart = (await call("chart_request_status", partner(), 200, request_id=test_request)).parsed
    assert chart.status == m.ChartRequestStatus.READY
    url = (await call("chart_download_url", partner(), 200, request_id=test_request)).parsed
    assert url.download_url.startswith("http")

    # The document and its browsable form.
    doc = await call("openapi_document", call.client(), 200)
    assert json.loads(doc.content)["openapi"] == "3.1.0"
    assert "swagger-ui" in (await call("api_docs", call.client(), 200)).content.decode()
    schema = await call("chart_schema", call.client(), 200)
    assert json.loads(schema.content)["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert {a.status for a in page.appointments} <= {s.value for s in m.AppointmentStatus}  # an enum now

    assert call.called == set(call.modules), set(call.modules) - call.called
