"""The console's SMART settings and refresh-token grants (issue 34, item 4) in headless Chromium
against a real `svc-auth serve`, by labels like tests/test_browser_console.py: the partner edits the
client type, the declared SMART scopes (offline_access/online_access) and the offline lifetime, with
the CLI's validation beside the field; lists the app's live grants per clinic and revokes one,
after which its refresh token is refused by the token endpoint."""
from __future__ import annotations

import json
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
    page.get_by_role("link", name="Grants").click()
    page.get_by_role("heading", name="Test Clinic").wait_for()
    assert page.get_by_role("row").filter(has_text="offline").count() == 2
    page.get_by_role("button", name="Revoke the grant of Doc Tor in Test Clinic").click()
    page.get_by_role("status").filter(has_text="The grant is revoked").wait_for()
    assert page.get_by_role("button", name="Revoke the grant of Doc Tor in Test Clinic").count() == 0
    assert page.get_by_role("button", name="Revoke the grant of Staff Member in Test Clinic").count() == 1
    status, body = refresh(live, app, world.secret, doctor["refresh_token"])
    assert status == 400 and body["error"] == "invalid_grant", body
    status, body = refresh(live, app, world.secret, staff["refresh_token"])
    assert status == 200 and body["refresh_token"], body

    # SMART settings: the CLI's validation, beside the field; then saved.
    page.get_by_role("link", name="Settings and secrets").click()
    assert page.get_by_label("Confidential client").is_checked()
    assert page.get_by_label("Declared SMART scopes").input_value() == app.smart_scopes
    page.get_by_label("Declared SMART scopes").fill("launch openid admin")
    page.get_by_role("button", name="Update SMART settings").click()
    page.locator("#smart_scopes-error").filter(has_text="admin").wait_for()
    assert page.get_by_label("Declared SMART scopes").get_attribute("aria-invalid") == "true"
    page.get_by_label("Declared SMART scopes").fill("launch openid online_access patient/*.rs")
    page.get_by_label("Offline access lifetime (seconds)").fill("60")
    page.get_by_role("button", name="Update SMART settings").click()
    page.locator("#offline_access_ttl-error").wait_for()
    page.get_by_label("Offline access lifetime (seconds)").fill("86400")
    page.get_by_label("Public client").check()
    page.get_by_role("button", name="Update SMART settings").click()
    page.get_by_role("status").filter(has_text="SMART settings are saved").wait_for()
    saved = Application.get_by_id(app.id)
    assert saved.public and saved.smart_scopes == "launch openid online_access patient/*.rs"
    assert saved.offline_access_ttl == 86400 and "Public client" in page.locator("#client-type").inner_text()
    # confidential again: the new secret is shown once
    page.get_by_label("Confidential client").check()
    page.get_by_role("button", name="Update SMART settings").click()
    secret = page.get_by_label("New client secret").input_value()
    assert len(secret) >= 32 and not Application.get_by_id(app.id).public
