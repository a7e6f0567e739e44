"""The whole launch in headless Chromium: hub -> launch -> authorize -> app -> SDK -> platform.

`svc-auth serve --demo` runs as a real subprocess (SQLite) with the example partner app on a
second loopback port; Debian's /usr/bin/chromium is driven with Playwright (the pip package only,
no browser download). The activation status is set through the `Installation` model where a test
needs a given starting point.
"""
from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request

import pytest

from models.clock import Clock
from runtime import Runtime
from helpers.browser import APP_ID, TIMEOUT_MS, app_frame
from helpers.environment import ROOT
from helpers.processes import settings_env
from cli.demo_seed import DEMO_OTHER_ID, DEMO_PHYSICIAN_ID

pytestmark = pytest.mark.browser











def entry(page):
    return page.locator(f"#app-entry-{APP_ID}")


def test_physician_launch_resolves_the_id_token_then_the_app_is_greyed_out(demo, page):
    demo.set_status(None)
    page.goto(demo.signin(DEMO_PHYSICIAN_ID))
    assert entry(page).get_attribute("aria-disabled") == "false"
    entry(page).click()
    frame = app_frame(page)
    assert frame.locator("#sdk-error").inner_text() == ""
    claims = json.loads(frame.locator("#id-token-claims").inner_text())
    assert claims["sub"] == DEMO_PHYSICIAN_ID
    assert claims["email"] == "dr.ada.lovelace@sandbox.example"
    assert (claims["given_name"], claims["family_name"]) == ("Ada", "Lovelace")
    assert claims["aud"] == "demo-partner-app" and claims["iss"] == demo.url + "/"
    assert claims["application_billing_plan"] == "free_trial" and claims["is_free_trial"] is True
    # The app landed on its redirect_uri, and the SDK removed the single-use code from the URL.
    app_page = page.frame(url=lambda url: url.startswith(demo.app_url))
    landed = urllib.parse.urlsplit(app_page.url)
    assert f"{landed.scheme}://{landed.netloc}{landed.path}" == f"{demo.app_url}/app"
    assert "code" not in urllib.parse.parse_qs(landed.query)  # (the app's own `state` may stay)
    # The SSO step worked too: the app opened its own session with the ID token.
    frame.locator("#app-session").filter(has_text="App session open").wait_for(timeout=TIMEOUT_MS)
    page.locator("#hub-status").filter(has_text="verified").wait_for(timeout=TIMEOUT_MS)
    # The platform verified the token: a new installation becomes Disabled, greyed out in the hub.
    assert demo.status() == "Disabled"
    page.locator(f"#app-entry-{APP_ID}[aria-disabled='true']").wait_for(timeout=TIMEOUT_MS)
    page.reload()
    assert entry(page).get_attribute("aria-disabled") == "true"
    entry(page).click(force=True)
    page.locator("#hub-status").filter(has_text="cannot be opened").wait_for(timeout=TIMEOUT_MS)
    assert page.locator("#app-frame").get_attribute("src") is None
    # A deep link does not open it either.
    page.goto(demo.signin(DEMO_PHYSICIAN_ID, APP_ID))
    page.locator("#hub-status").filter(has_text="cannot be opened").wait_for(timeout=TIMEOUT_MS)
    assert page.locator("#app-frame").get_attribute("src") is None


def test_user_the_app_refuses_sees_the_403(demo, page):
    demo.set_status("Enabled")
    page.goto(demo.signin(DEMO_OTHER_ID, APP_ID))
    frame = app_frame(page)
    error = frame.locator("#sdk-error").inner_text()
    assert "403" in error and "not authorized" in error
    assert frame.locator("#id-token-claims").inner_text() == ""
    page.locator("#hub-status").filter(has_text="did not start").wait_for(timeout=TIMEOUT_MS)


def test_trial_expired_is_shown_by_the_app(demo, page):
    # The demo server runs in its own process, on the real clock.
    demo.set_status("Enabled", trial_started_at=Clock().now() - dt.timedelta(days=31))
    billed = demo.billable_users()
    page.goto(demo.signin(DEMO_PHYSICIAN_ID, APP_ID))
    error = app_frame(page).locator("#sdk-error").inner_text()
    assert error.startswith("403 trial_expired: ") and "free trial" in error
    # The SDK never handed a token to the hub, so the platform verified nothing: not billed,
    # although the trial has ended and the app is Enabled.
    page.locator("#hub-status").filter(has_text="did not start").wait_for(timeout=TIMEOUT_MS)
    assert demo.billable_users() == billed
    assert demo.status() == "Enabled"


def test_enabled_app_opens_again_and_a_new_one_is_openable(demo, page):
    for status in ("Enabled", None):
        demo.set_status(status)
        page.goto(demo.signin(DEMO_PHYSICIAN_ID, APP_ID))
        claims = json.loads(app_frame(page).locator("#id-token-claims").inner_text())
        assert claims["sub"] == DEMO_PHYSICIAN_ID
    assert demo.status() == "Disabled"  # the first completed initialization of a new installation


def test_an_app_named_like_markup_leaves_the_hub_working(demo, page):
    """An app's name is its developer's (the console sets it). `<!--<script>` in the hub's JSON data
    element put Chromium's parser in a mode that swallowed hub.js and the whole body as its text: no
    app list, for every clinic with the app. So did `?app=<!--<script>` in the hub's URL."""
    def rename(name: str) -> None:
        result = subprocess.run([sys.executable, "-m", "cli.__main__", "apps", "update", "--app", APP_ID, "--name", name],
                                env=settings_env(demo.settings), cwd=str(ROOT), capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
    shown = subprocess.run([sys.executable, "-m", "cli.__main__", "apps", "show", "--app", APP_ID, "--json"],
                           env=settings_env(demo.settings), cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    original = json.loads(shown.stdout)["name"]
    rename("Demo <!--<script> & </script> app")
    try:
        page.goto(demo.signin(DEMO_PHYSICIAN_ID))
        entry(page).wait_for(timeout=TIMEOUT_MS)
        assert "Demo <!--<script> & </script> app" in entry(page).inner_text()
        page.goto(demo.url + "/sandbox/hub?app=%3C!--%3Cscript%3E")
        entry(page).wait_for(timeout=TIMEOUT_MS)
        assert page.locator("#hub-status").count() == 1
    finally:
        rename(original)


def test_sdk_refuses_messages_from_a_page_that_does_not_frame_it(demo, page):
    """Opened top-level (not in the hub), the SDK rejects instead of talking to anyone."""
    page.goto(f"{demo.app_url}/app?code=whatever")
    page.locator("#sdk-error:not(:empty)").wait_for(timeout=TIMEOUT_MS)
    assert "hub" in page.locator("#sdk-error").inner_text()


def activation_operation_available(demo) -> bool:
    request = urllib.request.Request(
        f"{demo.url}/v1/applications/{APP_ID}/organizations/org_demo_clinic/activation-status", method="PUT",
        data=b'{"status": "Enabled"}', headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(request, timeout=5)
    except urllib.error.HTTPError as exc:
        return not (exc.code == 404 and json.loads(exc.read() or b"{}").get("error") == "not_found")
    return True


def test_enable_for_this_clinic_button(demo, page):
    if not activation_operation_available(demo):
        pytest.skip("the activation REST operation is not mounted on this branch")
    demo.set_status(None)
    page.goto(demo.signin(DEMO_PHYSICIAN_ID, APP_ID))
    frame = app_frame(page)
    frame.locator("#enable-clinic:not([disabled])").click(timeout=TIMEOUT_MS)
    frame.locator("#activation-result").filter(has_text="Activation status: Enabled").wait_for(timeout=TIMEOUT_MS)
    assert demo.status() == "Enabled"
    page.reload()
    assert entry(page).get_attribute("aria-disabled") == "false"


def demo_credentials(demo) -> dict:
    """`svc-auth demo seed --json` (idempotent): the demo app's client credentials and ids."""
    result = subprocess.run([sys.executable, "-m", "cli.__main__", "demo", "seed", "--json"],
                            env=settings_env(demo.settings), cwd=str(ROOT), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def rest(demo, method, path, body=None, headers=None) -> tuple[int, dict]:
    request = urllib.request.Request(demo.url + path, method=method, headers={
        "Content-Type": "application/json", **(headers or {})}, data=json.dumps(body).encode() if body else None)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def app_sets_own_status(demo, credentials, status: str) -> None:
    """What the partner's backend does: a client-credentials token, then the activation operation."""
    code, token = rest(demo, "POST", "/v1/oauth/token", {
        "grant_type": "client_credentials", "client_id": credentials["client_id"],
        "client_secret": credentials["client_secret"]})
    assert code == 200, token
    code, body = rest(demo, "PUT", f"/v1/applications/{credentials['application_id']}/organizations/"
                                   f"{credentials['organization_id']}/activation-status", {"status": status},
                      {"Authorization": f"Bearer {token['access_token']}"})
    assert code == 200 and body["status"] == status, body


def test_the_hub_follows_the_activation_status_the_app_sets(demo, page):
    """The app enables and disables itself through the REST API; the open hub follows at once
    (it re-reads its list), and a reload shows the same."""
    credentials = demo_credentials(demo)
    demo.set_status("Disabled")  # as after the first completed SDK initialization
    page.goto(demo.signin(DEMO_PHYSICIAN_ID))
    assert entry(page).get_attribute("aria-disabled") == "true"

    app_sets_own_status(demo, credentials, "Enabled")
    page.locator(f"#app-entry-{APP_ID}[aria-disabled='false']").wait_for(timeout=TIMEOUT_MS)  # no reload
    entry(page).click()
    claims = json.loads(app_frame(page).locator("#id-token-claims").inner_text())
    assert claims["sub"] == DEMO_PHYSICIAN_ID and claims["days_until_end_of_trial"] == 30

    app_sets_own_status(demo, credentials, "Disabled")
    page.locator(f"#app-entry-{APP_ID}[aria-disabled='true']").wait_for(timeout=TIMEOUT_MS)  # no reload
    page.reload()
    assert entry(page).get_attribute("aria-disabled") == "true"
    assert "Disabled" in entry(page).inner_text()
    entry(page).click(force=True)
    page.locator("#hub-status").filter(has_text="cannot be opened").wait_for(timeout=TIMEOUT_MS)
    assert page.locator("#app-frame").get_attribute("src") is None

    app_sets_own_status(demo, credentials, "Enabled")
    page.locator(f"#app-entry-{APP_ID}[aria-disabled='false']").wait_for(timeout=TIMEOUT_MS)
    entry(page).click()
    claims = json.loads(app_frame(page).locator("#id-token-claims").inner_text())
    assert claims["sub"] == DEMO_PHYSICIAN_ID
    assert demo.status() == "Enabled"


def register_redirects(demo, launch_url: str, redirect_uri: str, exact: list[str] | None = None) -> None:
    """The demo app's launch URL and redirect base, and with `exact` its exact redirect URIs (else
    prefix mode), as the console saves them (every process hears the change)."""
    from lifecycle.applications import set_redirect_policy
    from lifecycle.manifest import update_manifest
    runtime = Runtime(demo.settings)
    try:
        update_manifest(runtime, APP_ID, "operator", launch_url=launch_url, redirect_uri=redirect_uri)
        set_redirect_policy(runtime, APP_ID, "exact" if exact else "prefix", exact or ())
    finally:
        runtime.close()


def test_an_app_sent_to_another_of_its_exact_redirect_origins_starts_in_the_hub(demo, page):
    """An app with several exact redirect URIs on several origins: the hub framed only the launch
    origin and the manifest's first redirect origin, and heard the SDK only from that one. The demo
    app launched at `localhost` (its manifest redirect URI there too) redirects, as it always does,
    to its redirect URI at `127.0.0.1`, which it also registered: the hub's CSP did not list that
    origin and hub.js dropped the SDK's messages from it, so the app showed "The platform did not
    answer 'context' in time". Now the app starts there and resolves the ID token."""
    localhost = demo.app_url.replace("127.0.0.1", "localhost")
    register_redirects(demo, f"{localhost}/launch", f"{localhost}/app", [f"{localhost}/app", f"{demo.app_url}/app"])
    try:
        demo.set_status("Enabled")
        page.goto(demo.signin(DEMO_PHYSICIAN_ID))
        while localhost not in page.locator("#hub-data").text_content():  # until serve has heard the change
            page.reload()
        entry(page).click()
        frame = app_frame(page)
        assert frame.locator("#sdk-error").inner_text() == ""
        assert json.loads(frame.locator("#id-token-claims").inner_text())["sub"] == DEMO_PHYSICIAN_ID
        assert page.frame(url=lambda url: url.startswith(f"{demo.app_url}/app")) is not None
        page.locator("#hub-status").filter(has_text="verified").wait_for(timeout=TIMEOUT_MS)
    finally:
        register_redirects(demo, f"{demo.app_url}/launch", f"{demo.app_url}/app")



def test_sign_out_from_the_hub_in_a_browser(demo, page):
    """Chromium posts the hub's `Sign out` form with `Origin: null` (the page's Referrer-Policy is
    no-referrer): the Origin check refused it (403) and nobody could sign out."""
    page.goto(demo.signin(DEMO_PHYSICIAN_ID))
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(f"{demo.url}/sandbox/signin", timeout=TIMEOUT_MS)
    page.goto(f"{demo.url}/sandbox/hub")
    assert urllib.parse.urlsplit(page.url).path == "/sandbox/signin"


def test_sign_out_works_on_a_plain_http_host_name(tmp_path):
    """Over plain http to a host name (a demo on a LAN, not loopback) Chromium sends no
    `Sec-Fetch-Site`, and a no-referrer page's form posts `Origin: null`: the hub's `Sign out` was
    refused (403). The sandbox pages send `Referrer-Policy: same-origin`, so the browser names its
    origin."""
    from playwright.sync_api import sync_playwright
    from helpers.browser import CHROMIUM, CHROMIUM_ARGS, Demo
    from helpers.processes import stop_process
    (tmp_path / "demo").mkdir()
    demo = Demo(tmp_path / "demo", host="svc-auth.test")
    try:
        with sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True,
                args=[*CHROMIUM_ARGS, "--host-resolver-rules=MAP svc-auth.test 127.0.0.1"])
            try:
                page = context.new_page()
                page.goto(demo.signin(DEMO_PHYSICIAN_ID))
                page.get_by_role("button", name="Sign out").click()
                page.wait_for_url(f"{demo.url}/sandbox/signin", timeout=TIMEOUT_MS)
            finally:
                context.close()
    finally:
        stop_process(demo.proc)
