"""A real SMART client end to end: the example SMART app (npm `fhirclient`, a browser-only public
client) launched from the sandbox hub in headless Chromium.

`svc-auth serve --demo` runs as a subprocess with the example SMART app under `/smart/` on the
example app's port, registered as a public client and installed in the demo clinic. The physician
signs in with a one-time link and clicks `Open Example SMART App` on a patient's row; inside
`#app-frame` fhirclient reads `{iss}/.well-known/smart-configuration`, authorizes with `aud`,
`launch`, `scope` and PKCE S256, exchanges the code with `client_id` and its verifier (no secret),
then reads the patient from the platform's FHIR API. The requests the browser made are recorded
to check the protocol; the patient shown is compared with what the FHIR API returns for that
token and with what the sandbox EHR holds. The app refuses the demo's non-authorized user.
"""
from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request

import pytest

from helpers.browser import TIMEOUT_MS
from helpers.environment import ROOT
from connectors.sandbox import patient_panel
from fhir_api import fhir_base_url
from cli.demo_seed import (DEMO_ORG_ID, DEMO_OTHER_ID, DEMO_PHYSICIAN_ID, DEMO_SMART_APP_ID, DEMO_SMART_APP_NAME,
                           DEMO_SMART_CLIENT_ID, demo_fhir_user)

pytestmark = pytest.mark.browser

OUTCOMES = "#smart-patient:not([hidden]), #smart-refused:not([hidden]), #smart-error:not([hidden])"


def smart_frame(page):
    """The SMART app's frame in the hub, once it shows an outcome (patient, refusal or error)."""
    page.wait_for_selector("#app-frame:not([hidden])", timeout=TIMEOUT_MS)
    frame = page.frame_locator("#app-frame")
    frame.locator(OUTCOMES).first.wait_for(timeout=TIMEOUT_MS)
    return frame


def fhirclient_state(page, demo) -> dict:
    """fhirclient's own state (sessionStorage, as `FHIR.oauth2.ready()` left it): server URL,
    PKCE verifier and the token response."""
    app = page.frame(url=lambda url: url.startswith(f"{demo.app_url}/smart/"))
    # fhirclient's BrowserStorage keeps JSON values: SMART_KEY holds the (JSON) key of the state.
    return app.evaluate("() => JSON.parse(sessionStorage.getItem(JSON.parse(sessionStorage.getItem('SMART_KEY'))))")


def record_requests(page) -> list:
    requests = []
    page.context.on("request", lambda request: requests.append(request))
    return requests


def fhir_get(url: str, token: str | None) -> tuple[int, dict]:
    headers = {"Accept": "application/fhir+json", **({"Authorization": f"Bearer {token}"} if token else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def jwt_claims(token: str) -> dict:
    """A JWT's payload, unverified (the signature is the interop tests' business)."""
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def human_name(patient: dict) -> str:
    name = patient["name"][0]
    return " ".join([*name.get("given", []), name["family"]])


def test_physician_opens_the_smart_app_on_a_patient_row(demo, page):
    requests = record_requests(page)
    page.goto(demo.signin(DEMO_PHYSICIAN_ID))
    row = page.locator("tr[data-patient-id]").first
    row.wait_for(timeout=TIMEOUT_MS)
    patient_id = row.get_attribute("data-patient-id")
    row.get_by_role("button", name=f"Open {DEMO_SMART_APP_NAME}", exact=True).click()
    frame = smart_frame(page)
    assert frame.locator("#smart-error").is_hidden(), frame.locator("#smart-error").inner_text()
    assert frame.locator("#smart-refused").is_hidden()
    shown = frame.locator("#smart-patient")
    assert shown.get_attribute("data-patient-id") == patient_id

    # fhirclient completed an EHR launch as a public client with PKCE.
    iss = fhir_base_url(demo.settings, DEMO_ORG_ID)
    state = fhirclient_state(page, demo)
    assert state["serverUrl"] == iss and state["clientId"] == DEMO_SMART_CLIENT_ID
    response = state["tokenResponse"]
    assert response["patient"] == patient_id and response["token_type"] == "Bearer"
    assert "patient/Patient.rs" in response["scope"].split()
    assert not state.get("clientSecret") and state["codeVerifier"]  # a public client: PKCE, no secret
    urls = [r.url for r in requests]
    assert f"{iss}/.well-known/smart-configuration" in urls
    (authorize,) = [r for r in requests if "code_challenge=" in r.url]
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(authorize.url).query)
    assert query["aud"] == [iss] and query["client_id"] == [DEMO_SMART_CLIENT_ID]
    assert query["code_challenge_method"] == ["S256"] and query["launch"][0]
    assert query["redirect_uri"] == [f"{demo.app_url}/smart/index.html"]
    assert {"launch", "openid", "fhirUser", "patient/Patient.rs"} <= set(query["scope"][0].split())
    (exchange,) = [r for r in requests if r.method == "POST" and "grant_type=authorization_code" in (r.post_data or "")]
    body = urllib.parse.parse_qs(exchange.post_data)
    assert body["client_id"] == [DEMO_SMART_CLIENT_ID] and body["code_verifier"] == [state["codeVerifier"]]
    assert "client_secret" not in body and "authorization" not in exchange.headers
    # The ID token names the physician; the app let them in.
    claims = jwt_claims(response["id_token"])
    assert claims["sub"] == DEMO_PHYSICIAN_ID and claims["fhirUser"] == demo_fhir_user(demo.settings, DEMO_PHYSICIAN_ID)

    # The patient shown is the one the FHIR API gives that token, and the one the EHR holds.
    status, patient = fhir_get(f"{iss}/Patient/{patient_id}", response["access_token"])
    assert status == 200 and patient["resourceType"] == "Patient" and patient["id"] == patient_id
    assert frame.locator("#smart-patient-name").inner_text() == human_name(patient)
    assert frame.locator("#smart-patient-birth-date").inner_text() == patient["birthDate"]
    held = next(p for p in patient_panel(DEMO_ORG_ID) if p.id == patient_id)
    assert human_name(patient) == f"{held.first_name} {held.last_name}"
    assert patient["birthDate"] == str(held.date_of_birth)[:10]
    assert any(r.url == f"{iss}/Patient/{patient_id}" for r in requests)  # the app read it itself

    # The token reaches only its own clinic, and nothing without it.
    other = fhir_base_url(demo.settings, "org_another_clinic")
    assert fhir_get(f"{other}/Patient/{patient_id}", response["access_token"])[0] == 404
    assert fhir_get(f"{iss}/Patient/{patient_id}", None)[0] == 401


def test_the_smart_app_refuses_a_user_it_does_not_serve(demo, page):
    requests = record_requests(page)
    page.goto(demo.signin(DEMO_OTHER_ID, DEMO_SMART_APP_ID))  # the deep link: the hub opens the app at once
    frame = smart_frame(page)
    assert frame.locator("#smart-error").is_hidden(), frame.locator("#smart-error").inner_text()
    assert "not authorized" in frame.locator("#smart-refused").inner_text()
    assert frame.locator("#smart-patient").is_hidden()
    assert frame.locator("#smart-patient-name").inner_text() == ""
    # The launch itself completed (the refusal is the app's), and it read no FHIR resource.
    state = fhirclient_state(page, demo)
    assert jwt_claims(state["tokenResponse"]["id_token"])["sub"] == DEMO_OTHER_ID
    iss = fhir_base_url(demo.settings, DEMO_ORG_ID)
    assert not [r.url for r in requests if r.url.startswith(iss + "/") and "/.well-known/" not in r.url
                and not r.url.endswith("/metadata")]


def token_post(url: str, form: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=urllib.parse.urlencode(form).encode(), method="POST",
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_fhirclient_refreshes_with_online_access_and_a_replay_ends_the_grant(demo, page):
    """npm fhirclient's own `client.refresh()` (issue 34): the demo app asks `online_access`; a
    click refreshes in the hub's frame, rotating the refresh token; replaying the spent one (as a
    thief would) revokes the grant, and the app's newest access token stops at the FHIR API."""
    requests = record_requests(page)
    page.goto(demo.signin(DEMO_PHYSICIAN_ID))
    row = page.locator("tr[data-patient-id]").first
    row.wait_for(timeout=TIMEOUT_MS)
    row.get_by_role("button", name=f"Open {DEMO_SMART_APP_NAME}", exact=True).click()
    frame = smart_frame(page)
    assert frame.locator("#smart-error").is_hidden(), frame.locator("#smart-error").inner_text()
    first = fhirclient_state(page, demo)["tokenResponse"]
    assert "online_access" in first["scope"].split() and first["refresh_token"]
    patient_id = frame.locator("#smart-patient").get_attribute("data-patient-id")

    frame.get_by_role("button", name="Refresh access token").click()
    frame.locator("#smart-refreshed[data-count='1']").wait_for(timeout=TIMEOUT_MS)
    assert frame.locator("#smart-error").is_hidden(), frame.locator("#smart-error").inner_text()
    second = fhirclient_state(page, demo)["tokenResponse"]
    assert second["refresh_token"] != first["refresh_token"] and second["access_token"] != first["access_token"]
    assert second["patient"] == patient_id and second["scope"] == first["scope"]
    (refresh,) = [r for r in requests if r.method == "POST" and "grant_type=refresh_token" in (r.post_data or "")]
    body = urllib.parse.parse_qs(refresh.post_data)
    assert body["refresh_token"] == [first["refresh_token"]] and body["client_id"] == [DEMO_SMART_CLIENT_ID]
    iss = fhir_base_url(demo.settings, DEMO_ORG_ID)
    assert fhir_get(f"{iss}/Patient/{patient_id}", second["access_token"])[0] == 200
    assert [r for r in requests if r.url == f"{iss}/Patient/{patient_id}"][1:]  # re-read with the new token

    token_endpoint = f"{demo.url}/v1/oauth/token"
    status, answer = token_post(token_endpoint, {"grant_type": "refresh_token", "client_id": DEMO_SMART_CLIENT_ID,
                                                 "refresh_token": first["refresh_token"]})
    assert status == 400 and answer["error"] == "invalid_grant", answer
    assert fhir_get(f"{iss}/Patient/{patient_id}", second["access_token"])[0] == 401
    frame.get_by_role("button", name="Refresh access token").click()  # the app's own next refresh fails too
    frame.locator("#smart-error:not([hidden])").wait_for(timeout=TIMEOUT_MS)
    assert "invalid_grant" in frame.locator("#smart-error").inner_text() or \
        "refresh" in frame.locator("#smart-error").inner_text().lower()


def test_an_app_in_the_hub_frame_shows_its_own_dialogs(demo, page):
    """The frame's sandbox has allow-modals: an app's alert() reaches the user (issue 34)."""
    page.goto(demo.signin(DEMO_PHYSICIAN_ID, DEMO_SMART_APP_ID))
    smart_frame(page)
    shown = []
    page.on("dialog", lambda dialog: (shown.append((dialog.type, dialog.message)), dialog.accept()))
    app = page.frame(url=lambda url: url.startswith(f"{demo.app_url}/smart/"))
    app.evaluate("() => alert('No results for this patient.')")
    assert shown == [("alert", "No results for this patient.")]


def test_the_vendored_fhirclient_is_the_pinned_release():
    """`make vendor-fhirclient` copies the release pinned in examples/smart_app/package.json."""
    app = ROOT / "examples" / "smart_app"
    pinned = json.loads((app / "package.json").read_text())["dependencies"]["fhirclient"]
    vendored = json.loads((app / "static" / "fhirclient" / "package.json").read_text())
    assert (vendored["name"], vendored["version"]) == ("fhirclient", pinned)
    assert (app / "static" / "fhirclient" / "LICENSE").read_text().startswith("Copyright")


def test_a_cross_site_form_post_to_authorize_lands_on_redirect_uri_by_get(live, runtime, world, page):
    """A real browser posting the authorization request as a form from another site (OIDC Core
    3.1.2.1; which sends no SameSite=Lax cookie): authorize needs none (the launch names the user),
    and its 303 makes Chromium GET redirect_uri with the code (never re-post the form there); the
    code is the launch user's."""
    from helpers.http import http
    from helpers.tokens import as_service
    from hub.sandbox import issue_sandbox_token
    app = world.app
    status, _, body = http("POST", f"{live}/v1/sandbox/launches", json.dumps({"client_id": app.client_id}).encode(),
                           {"Authorization": f"Bearer {issue_sandbox_token(as_service(runtime, live), world.physician)}",
                            "Content-Type": "application/json"})
    assert status == 201, body
    fields = {"client_id": app.client_id, "redirect_uri": app.redirect_uri, "response_type": "code",
              "launch_id": json.loads(body)["launch_id"], "state": "from-a-form", "nonce": "n-form"}
    arrived = []

    def at_redirect_uri(route):
        arrived.append((route.request.method, route.request.url))
        route.fulfill(status=200, content_type="text/html", body="<p id=arrived>app</p>")

    page.route(app.redirect_uri + "**", at_redirect_uri)
    inputs = "".join(f'<input type="hidden" name="{k}" value="{v}">' for k, v in fields.items())
    page.route("https://other-site.example/**", lambda route: route.fulfill(
        status=200, content_type="text/html",
        body=f'<form method="post" action="{live}/v1/oauth/authorize">{inputs}<button>Go</button></form>'))
    page.goto("https://other-site.example/start")
    page.click("button")
    page.wait_for_selector("#arrived", timeout=TIMEOUT_MS)
    [(method, url)] = arrived
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
    assert method == "GET" and url.startswith(app.redirect_uri + "?") and query["state"] == "from-a-form"
    token_body = urllib.parse.urlencode({"grant_type": "authorization_code", "code": query["code"],
                                         "client_id": app.client_id, "client_secret": world.secret}).encode()
    status, _, answer = http("POST", f"{live}/v1/oauth/token", token_body,
                             {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 200, answer
    claims = jwt_claims(json.loads(answer)["id_token"])
    assert claims["sub"] == world.physician.id and claims["nonce"] == "n-form"
