"""The console's SMART settings and refresh-token grants (issue 34, item 4) in headless Chromium
against a real `svc-auth serve`, by labels like tests/test_browser_console.py: the partner edits the
client type, the declared SMART scopes (offline_access/online_access), the allowed origins and the
offline lifetime, with the CLI's validation beside the field; lists the app's live grants per clinic
and revokes one, after which its refresh token is refused by the token endpoint.

Every control named in CONTRACTS.md ("Developer console") is found here by its role and its name
*exactly* (`exact=True`), as a check from outside may find it: `Public client` (a checkbox),
`SMART scopes`, `Allowed origins`, `Save SMART settings`, `Save`, `Revoke` and `Enable` in a row,
and a secret shown once in an element labelled `Client secret`."""
from __future__ import annotations

import json
import re
import urllib.parse

import pytest

from helpers.browser import TIMEOUT_MS
from helpers.http import http
from helpers.smart import launch_tokens
from console.accounts import invite_developer
from lifecycle.applications import set_smart_scopes
from models.application import DEFAULT_SMART_SCOPES, Application

pytestmark = pytest.mark.browser
PASSWORD = "a long console passphrase"
EMAIL = "dev@smart-partner.example"


def refresh(live, app, secret, refresh_token) -> tuple[int, dict]:
    status, _, body = http("POST", f"{live}/v1/oauth/token", urllib.parse.urlencode({
        "grant_type": "refresh_token", "refresh_token": refresh_token, "client_id": app.client_id,
        "client_secret": secret}).encode(), {"Content-Type": "application/x-www-form-urlencoded"})
    return status, json.loads(body)


def test_partner_edits_smart_settings_and_revokes_a_grant(live, runtime, world, page):
    app = set_smart_scopes(runtime, world.app.id, DEFAULT_SMART_SCOPES + " offline_access")
    scope = "launch openid offline_access patient/*.rs"
    doctor = launch_tokens(live, runtime, world.physician, app, world.secret, scope)
    staff = launch_tokens(live, runtime, world.staff, app, world.secret, scope)
    assert doctor["refresh_token"] and staff["refresh_token"]
    page.set_default_timeout(TIMEOUT_MS)

    _, invite_url, _ = invite_developer(runtime, app.id, EMAIL)
    page.goto(live + urllib.parse.urlsplit(invite_url).path)
    page.get_by_label("Password", exact=True).fill(PASSWORD)
    page.get_by_label("Confirm password").fill(PASSWORD)
    page.get_by_role("button", name="Set password").click()
    page.wait_for_url(f"{live}/console/login*")
    page.get_by_label("Email").fill(EMAIL)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{live}/console")
    page.get_by_role("link", name=app.name).click()
    page.wait_for_url(f"{live}/console/apps/{app.id}")

    # Grants: both clinicians' grants in the clinic; revoking the physician's ends its refresh token.
    page.get_by_role("link", name="Grants", exact=True).click()
    page.get_by_role("heading", name="Test Clinic").wait_for()
    assert page.get_by_role("row").filter(has_text="offline").count() == 2
    doctor_row = page.get_by_role("row").filter(has_text="Doc Tor")
    # One row per grant with the clinic, the user, the scope, online/offline and the expiry.
    cells = doctor_row.get_by_role("cell").all_inner_texts() + doctor_row.get_by_role("rowheader").all_inner_texts()
    assert {"Test Clinic", "Doc Tor", "offline"} <= {c.strip() for c in cells}, cells
    assert [set(c.split()) for c in cells if "offline_access" in c] == [set(scope.split())], cells
    assert sum(bool(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", c.strip())) for c in cells) == 2  # granted, expires
    doctor_row.get_by_role("button", name="Revoke", exact=True).click()
    page.get_by_role("status").filter(has_text="The grant is revoked").wait_for()
    assert page.get_by_role("row").filter(has_text="Doc Tor").count() == 0
    assert page.get_by_role("row").filter(has_text="Staff Member").get_by_role(
        "button", name="Revoke", exact=True).count() == 1
    status, body = refresh(live, app, world.secret, doctor["refresh_token"])
    assert status == 400 and body["error"] == "invalid_grant", body
    status, body = refresh(live, app, world.secret, staff["refresh_token"])
    assert status == 200 and body["refresh_token"], body

    # The clinic's status switch is a button named `Enable` in its row.
    page.get_by_role("link", name="Installations", exact=True).click()
    clinic_row = page.get_by_role("row").filter(has_text="Test Clinic")
    assert clinic_row.get_by_role("button", name="Enable", exact=True).count() == 1

    # SMART settings: the CLI's validation, beside the field; then saved.
    page.get_by_role("link", name="Settings and secrets").click()
    public = page.get_by_role("checkbox", name="Public client", exact=True)
    scopes = page.get_by_role("textbox", name="SMART scopes", exact=True)
    origins = page.get_by_role("textbox", name="Allowed origins", exact=True)
    save_smart = page.get_by_role("button", name="Save SMART settings", exact=True)
    assert not public.is_checked()
    assert scopes.input_value() == app.smart_scopes
    assert page.get_by_label("Allowed origins").count() == 1 and page.get_by_label("SMART scopes").count() == 1
    scopes.fill("launch openid admin")
    save_smart.click()
    page.locator("#smart_scopes-error").filter(has_text="admin").wait_for()
    assert scopes.get_attribute("aria-invalid") == "true"
    scopes.fill("launch openid online_access patient/*.rs")
    origins.fill("https://smart.example/app")  # a path: not an origin CORS can match
    save_smart.click()
    page.locator("#allowed_origins-error").filter(has_text="no path").wait_for()
    assert origins.get_attribute("aria-invalid") == "true" and Application.get_by_id(app.id).allowed_origins == []
    origins.fill("https://smart.example\nhttps://other.example")
    page.get_by_label("Offline access lifetime (seconds)").fill("60")
    save_smart.click()
    page.locator("#offline_access_ttl-error").wait_for()
    page.get_by_label("Offline access lifetime (seconds)").fill("86400")
    public.check()
    save_smart.click()
    page.get_by_role("status").filter(has_text="SMART settings are saved").wait_for()
    saved = Application.get_by_id(app.id)
    assert saved.public and saved.smart_scopes == "launch openid online_access patient/*.rs"
    assert saved.allowed_origins == ["https://smart.example", "https://other.example"]
    assert saved.offline_access_ttl == 86400 and "Public client" in page.locator("#client-type").inner_text()
    assert public.is_checked() and origins.input_value() == "https://smart.example\nhttps://other.example"
    # The manifest's `Save` (its own form) keeps the origins the SMART settings saved.
    page.get_by_role("textbox", name="Name", exact=True).fill("Renamed SMART App")
    page.get_by_role("button", name="Save", exact=True).click()
    page.get_by_role("status").filter(has_text="manifest is saved").wait_for()
    saved = Application.get_by_id(app.id)
    assert saved.name == "Renamed SMART App" and saved.allowed_origins == ["https://smart.example", "https://other.example"]
    # confidential again: the new secret is shown once, labelled `Client secret`
    public.uncheck()
    save_smart.click()
    secret = page.get_by_label("Client secret", exact=True).input_value()
    assert len(secret) >= 32 and not Application.get_by_id(app.id).public
