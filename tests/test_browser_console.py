"""The developer console in headless Chromium, against two real `svc-auth serve` processes on
PostgreSQL: the partner's steps in order, with launches going to the *other* process.

invite -> set password -> sign in (keyboard) -> edit the manifest, authorize follows the new
base URL -> narrow the permissions, userinfo drops the field -> rotate the secret through the
four steps while launches keep flowing (none fails) -> enable the clinic -> read the bill (the
same figures as the REST API) and download it as CSV -> audit trail -> sign out.

axe-core (npm, tests/js) checks every page for serious or critical violations. With
SVC_CONSOLE_SCREENSHOTS=docs/console the run refreshes the screenshots of docs/console.md.
Launches use the operator CLI's sandbox token and the REST launch API, never the hub pages.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import psycopg2
import pytest

from conf import Settings
from helpers.environment import PG_DSN, ROOT
from helpers.processes import free_port, settings_env, start_process, stop_process

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
AXE = ROOT / "tests" / "js" / "node_modules" / "axe-core" / "axe.min.js"  # `make test` installs it (npm ci)
TIMEOUT_MS = 20000
PASSWORD = "a long console passphrase"
EMAIL = "dev@notes-partner.example"


def http(method, url, body=None, headers=None, form=False):
    """(status, headers, parsed body) without following redirects."""
    headers = dict(headers or {})
    data = None
    if body is not None:
        data = (urllib.parse.urlencode(body) if form else json.dumps(body)).encode()
        headers["Content-Type"] = "application/x-www-form-urlencoded" if form else "application/json"

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None
    opener = urllib.request.build_opener(NoRedirect)
    try:
        response = opener.open(urllib.request.Request(url, data=data, headers=headers, method=method), timeout=20)
    except urllib.error.HTTPError as error:
        response = error
    raw = response.read()
    try:
        payload = json.loads(raw) if raw else None
    except ValueError:
        payload = raw.decode("utf-8", "replace")
    return response.status, response.headers, payload


def eventually(check, timeout=5.0):
    """`check()` until it is true: each process learns of an application change through the change
    feed within a second (issue 11's caches), so "at once" is measured with that bound."""
    deadline = time.time() + timeout
    while not check():
        assert time.time() < deadline, "the change did not reach the other process in time"
        time.sleep(0.05)


class Stack:
    """Two `serve` processes sharing one fresh PostgreSQL database, and the operator CLI."""

    def __init__(self, tmp):
        self.db_name = f"svc_console_{uuid.uuid4().hex[:10]}"
        admin = psycopg2.connect(PG_DSN + "/postgres")
        admin.autocommit = True
        admin.cursor().execute(f'CREATE DATABASE "{self.db_name}"')
        admin.close()
        self.console_port, self.api_port = free_port(), free_port()
        self.console = f"http://127.0.0.1:{self.console_port}"
        self.api = f"http://127.0.0.1:{self.api_port}"
        self.settings = Settings.build(issuer=self.console, database_url=f"{PG_DSN}/{self.db_name}",
                                       var_dir=str(tmp / "var"), keys_dir=str(tmp / "keys"), hmac_key="c" * 32)
        self.env = settings_env(self.settings, SVC_SANDBOX="on")
        self.procs = []
        for port in (self.console_port, self.api_port):
            self.procs.append(start_process(["serve", "--port", str(port)], self.env, port,
                                            log_path=tmp / f"serve-{port}.log"))

    def cli(self, *args, as_json=True):
        result = subprocess.run([sys.executable, "-m", "cli.__main__", *args, *(["--json"] if as_json else [])],
                                env=self.env, cwd=str(ROOT), capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout) if as_json else result.stdout.strip()

    def close(self):
        for proc in self.procs:
            stop_process(proc)
        admin = psycopg2.connect(PG_DSN + "/postgres")
        admin.autocommit = True
        admin.cursor().execute(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')
        admin.close()


class Launcher:
    """The host platform and the partner's backend, as plain HTTP against the API process:
    sandbox launch -> authorize -> token exchange (current secret, then the fallback on 401,
    as the spec's rotation asks the backend to do) -> userinfo; optionally the platform's
    verification of the access token (introspection with the user's sandbox token)."""

    def __init__(self, stack, app, user_id):
        self.stack, self.app = stack, app
        self.sandbox_token = stack.cli("sandbox", "token", "--user", user_id, as_json=False)
        self.redirect_uri = app["redirect_uri"]
        self.secrets = [app["client_secret"]]

    def authorize(self, redirect_uri):
        status, _, body = http("POST", f"{self.stack.api}/v1/sandbox/launches", {"client_id": self.app["client_id"]},
                               {"Authorization": f"Bearer {self.sandbox_token}"})
        assert status == 201, body
        query = urllib.parse.urlencode({"response_type": "code", "client_id": self.app["client_id"],
                                        "redirect_uri": redirect_uri, "launch_id": body["launch_id"]})
        return http("GET", f"{self.stack.api}/v1/oauth/authorize?{query}")

    def launch(self, verify=False) -> dict:
        status, headers, body = self.authorize(self.redirect_uri)
        if status != 302:
            return {"ok": False, "step": "authorize", "status": status, "body": body}
        code = urllib.parse.parse_qs(urllib.parse.urlsplit(headers["Location"]).query)["code"][0]
        tries = 0
        for secret in list(self.secrets):
            tries += 1
            status, _, tokens = http("POST", f"{self.stack.api}/v1/oauth/token", {
                "grant_type": "authorization_code", "client_id": self.app["client_id"], "client_secret": secret,
                "code": code})
            if status != 401:
                break
        if status != 200:
            return {"ok": False, "step": "token", "status": status, "body": tokens, "tries": tries}
        status, _, info = http("GET", f"{self.stack.api}/v1/oauth/userinfo",
                               headers={"Authorization": f"Bearer {tokens['access_token']}"})
        result = {"ok": status == 200, "step": "userinfo", "status": status, "userinfo": info, "tries": tries}
        if verify:
            status, _, body = http("POST", f"{self.stack.api}/v1/oauth/introspect",
                                   {"token": tokens["access_token"]},
                                   {"Authorization": f"Bearer {self.sandbox_token}"})
            result["ok"] = result["ok"] and status == 200 and body["active"] is True
        return result


class Traffic(threading.Thread):
    """Launches one after another until stopped, each tagged with the rotation phase."""

    def __init__(self, launcher):
        super().__init__(daemon=True)
        self.launcher, self.phase, self.results = launcher, "before", []
        self.stopped = threading.Event()

    def run(self):
        while not self.stopped.is_set():
            phase = self.phase
            try:
                outcome = self.launcher.launch()
            except Exception as exc:  # noqa: BLE001  (a failure to report, not to hide)
                outcome = {"ok": False, "error": repr(exc)}
            self.results.append({**outcome, "phase": phase, "phase_after": self.phase})

    def during(self, phase, launches=3, timeout=60):
        self.phase = phase
        deadline = time.time() + timeout
        while len(self.inside(phase)) < launches:
            assert time.time() < deadline and self.is_alive(), f"too few launches in {phase}"
            time.sleep(0.02)

    def inside(self, phase):
        return [r for r in self.results if r["phase"] == r["phase_after"] == phase]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    service = Stack(tmp_path_factory.mktemp("console-stack"))
    yield service
    service.close()


@pytest.fixture
def browser_page():
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        # bypass_csp: the console's CSP allows no inline or injected script; axe-core is injected.
        context = browser.new_context(viewport={"width": 1200, "height": 900}, bypass_csp=True, accept_downloads=True)
        try:
            yield context.new_page()
        finally:
            context.close()
            browser.close()


def check_accessibility(page, name):
    """axe-core on the current page: no serious or critical violation; optional screenshot."""
    assert AXE.exists(), "axe-core is missing: run `make test` (or `cd tests/js && npm ci`)"
    page.add_script_tag(path=str(AXE))
    result = page.evaluate("async () => await axe.run(document, {resultTypes: ['violations']})")
    bad = [(v["id"], v["impact"], [n["target"] for n in v["nodes"]]) for v in result["violations"]
           if v["impact"] in ("serious", "critical")]
    assert bad == [], f"{name}: {bad}"
    shots = os.environ.get("SVC_CONSOLE_SCREENSHOTS")
    if shots:
        Path(shots).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(shots) / f"{name}.png"), full_page=True)


def test_partner_walks_the_console(stack, browser_page):
    page = browser_page
    page.set_default_timeout(TIMEOUT_MS)
    org = stack.cli("orgs", "create", "--name", "Riverside Clinic", "--ehr", "sandbox")
    user = stack.cli("users", "create", "--org", org["id"], "--email", "ann.lee@riverside.example",
                     "--given-name", "Ann", "--family-name", "Lee", "--ehr-username", "alee")
    app = stack.cli("apps", "create", "--name", "Notes", "--redirect-uri", "https://notes.example/app",
                    "--launch-url", "https://notes.example/launch", "--token-endpoint", "https://notes.example/token",
                    "--billing-plan", "paid", "--user-fields", "email,name")
    stack.cli("installs", "create", "--app", app["application_id"], "--org", org["id"])
    launcher = Launcher(stack, app, user["id"])
    assert launcher.launch()["ok"]

    # 1. The operator invites the developer; the one-time link sets the password.
    invite = stack.cli("developers", "invite", "--app", app["application_id"], "--email", EMAIL)
    page.goto(invite["invite_url"])
    check_accessibility(page, "invite")
    page.get_by_label("Password", exact=True).fill(PASSWORD)
    page.get_by_label("Confirm password").fill(PASSWORD)
    page.get_by_role("button", name="Set password").click()
    page.wait_for_url(f"{stack.console}/console/login*")
    page.get_by_role("status").filter(has_text="password is set").wait_for()
    check_accessibility(page, "login")

    # 2. Sign in with the keyboard alone.
    page.get_by_label("Email").focus()
    page.keyboard.type(EMAIL)
    page.keyboard.press("Tab")
    page.keyboard.type(PASSWORD)
    page.keyboard.press("Enter")
    page.wait_for_url(f"{stack.console}/console")
    check_accessibility(page, "applications")
    page.get_by_role("link", name="Notes").click()
    page.wait_for_url(f"{stack.console}/console/apps/{app['application_id']}")
    assert page.locator("#client-id").inner_text() == app["client_id"]

    # 3. Edit the manifest: an error shows beside its field, then the new base URL applies at once
    #    in the other process.
    page.get_by_label("Redirect base URL").fill("notes.example/v2")
    page.get_by_role("button", name="Save", exact=True).click()
    page.locator("#redirect_uri-error").wait_for()
    assert page.get_by_label("Redirect base URL").get_attribute("aria-invalid") == "true"
    check_accessibility(page, "manifest-error")
    page.get_by_label("Redirect base URL").fill("https://notes.example/v2")
    page.get_by_role("button", name="Save", exact=True).click()
    page.get_by_role("status").filter(has_text="manifest is saved").wait_for()
    eventually(lambda: launcher.authorize("https://notes.example/app")[0] == 400)
    status, headers, _ = launcher.authorize("https://notes.example/app")
    assert status == 400 and "Location" not in headers
    status, headers, _ = launcher.authorize("https://notes.example/v2/callback")
    assert status == 302 and headers["Location"].startswith("https://notes.example/v2/callback?code=")
    launcher.redirect_uri = "https://notes.example/v2/callback"
    assert launcher.launch()["userinfo"]["given_name"] == "Ann"

    # 4. Narrow the permissions: userinfo drops the name at once.
    page.get_by_label("name", exact=True).uncheck()
    page.get_by_role("button", name="Save", exact=True).click()
    page.get_by_role("status").filter(has_text="manifest is saved").wait_for()
    assert not page.get_by_label("name", exact=True).is_checked() and page.get_by_label("email", exact=True).is_checked()
    eventually(lambda: "given_name" not in launcher.launch()["userinfo"])
    info = launcher.launch()["userinfo"]
    assert "given_name" not in info and "family_name" not in info and info["email"] == "ann.lee@riverside.example"
    check_accessibility(page, "manifest")

    # 5. Rotate the secret through the four steps while launches keep flowing.
    old = app["client_secret"]
    traffic = Traffic(launcher)
    traffic.start()
    try:
        traffic.during("before")
        traffic.phase = "1-generating"
        page.get_by_role("button", name="Generate fallback secret").click()
        new = page.get_by_label("Fallback secret").input_value()
        assert new and new != old
        check_accessibility(page, "fallback-generated")
        traffic.during("1-generated")
        status, _, _ = http("POST", f"{stack.api}/v1/oauth/token", {
            "grant_type": "client_credentials", "client_id": app["client_id"], "client_secret": new})
        assert status == 401  # not valid yet
        launcher.secrets = [old, new]  # step 2: the backend retries with the fallback
        traffic.during("2-backend-has-fallback")
        page.goto(f"{stack.console}/console/apps/{app['application_id']}")  # not reload: that re-POSTs
        assert new not in page.content()  # shown once
        page.get_by_role("button", name="Activate fallback secret").click()
        warning = page.get_by_role("alert").filter(has_text="breaks integrations")
        warning.wait_for()
        check_accessibility(page, "activation-warning")
        traffic.phase = "3-activating"
        page.get_by_role("button", name="Confirm activation").click()
        page.get_by_role("status").filter(has_text="only valid client secret").wait_for()
        eventually(lambda: http("POST", f"{stack.api}/v1/oauth/token", {
            "grant_type": "client_credentials", "client_id": app["client_id"], "client_secret": old})[0] == 401)
        traffic.during("3-activated")
        launcher.secrets = [new]  # step 4: the fallback becomes the backend's current secret
        traffic.during("4-promoted")
    finally:
        traffic.stopped.set()
        traffic.join(30)
    failed = [r for r in traffic.results if not r["ok"]]
    assert failed == [], [(r["phase"], r["phase_after"], r.get("tries"), r["status"]) for r in failed]
    assert {r["tries"] for r in traffic.inside("3-activated")} == {2}  # the old secret refused, the fallback works
    assert {r["tries"] for r in traffic.inside("4-promoted")} == {1}
    assert {r["phase"] for r in traffic.results} >= {"1-generating", "3-activating"}

    # 6. The first launch the platform verifies initializes the installation (Disabled); the
    #    developer enables the clinic in the console.
    assert launcher.launch(verify=True)["ok"]
    page.get_by_role("link", name="Installations").click()
    row = page.locator(f"#org-{org['id']}")
    assert "Disabled" in row.inner_text()
    check_accessibility(page, "installations")
    row.get_by_role("button", name="Enable").focus()
    page.keyboard.press("Enter")  # the switch works from the keyboard
    page.get_by_role("status").filter(has_text="activation status is saved").wait_for()
    row = page.locator(f"#org-{org['id']}")
    assert "Enabled" in row.inner_text() and row.get_by_role("button", name="Disable").is_visible()
    assert "ann.lee@riverside.example" in page.content() and "authorized" in page.content()

    # 7. A verified launch while Enabled is billable; the console's bill equals the REST API's.
    assert launcher.launch(verify=True)["ok"]
    page.get_by_role("link", name="Billing").click()
    assert page.locator("#total-billable").inner_text().endswith("1")
    check_accessibility(page, "billing")
    status, _, token = http("POST", f"{stack.api}/v1/oauth/token", {
        "grant_type": "client_credentials", "client_id": app["client_id"], "client_secret": new})
    month = page.get_by_label("Month (YYYY-MM)").input_value()
    status, _, bill = http("GET", f"{stack.api}/v1/applications/{app['application_id']}/billing?month={month}",
                           headers={"Authorization": f"Bearer {token['access_token']}"})
    assert status == 200 and bill["total_billable_users"] == 1
    group = bill["organizations"][0]
    assert page.get_by_role("row", name=group["organization_name"]).inner_text().split("\t")[1:] == \
        [str(group["billable_users"]), "ann.lee@riverside.example"]
    with page.expect_download() as download:
        page.get_by_role("link", name="Download CSV").click()
    lines = Path(download.value.path()).read_text().splitlines()
    assert len(lines) == 2 and lines[1].startswith(f"{month},{app['application_id']},{org['id']},")

    # 8. The audit trail names the developer for every step.
    page.get_by_role("link", name="Audit").click()
    check_accessibility(page, "audit")
    trail = page.locator("table.audit").inner_text()
    for action in ("application.manifest_updated", "application.secret.fallback_generated",
                   "application.secret.fallback_activated", "installation.activation_status_set"):
        assert f"developer:{EMAIL}\t{action}" in trail, action

    # An application that is not the developer's: the same 404 as an unknown one, accessible too.
    response = page.goto(f"{stack.console}/console/apps/app_not_yours")
    assert response.status == 404
    check_accessibility(page, "not-found")

    # 9. Sign out: the console asks to sign in again.
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(f"{stack.console}/console/login*")
    page.goto(f"{stack.console}/console/apps/{app['application_id']}")
    assert page.url.startswith(f"{stack.console}/console/login")
