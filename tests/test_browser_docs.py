"""`/v1/docs` in headless Chromium: Swagger UI renders every operation from local assets only, and
its OAuth 2.0 client-credentials "Authorize" plus "Try it out" call the partner API for real.

`svc-auth serve` runs as a real subprocess (SQLite); Debian's /usr/bin/chromium via Playwright.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conf import Settings
from helpers.browser import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS
from helpers.environment import ROOT
from helpers.processes import free_port, settings_env, start_process, stop_process
from partner_api.openapi import openapi_document

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser-docs")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    settings = Settings.build(issuer=url, database_url=f"sqlite:///{tmp}/svc.db", var_dir=str(tmp / "var"),
                              keys_dir=str(tmp / "keys"), hmac_key="d" * 32)
    env = settings_env(settings)

    def cli(*args):
        result = subprocess.run([sys.executable, "-m", "cli.__main__", *args, "--json"], env=env, cwd=str(ROOT),
                                capture_output=True, text=True, timeout=60, check=True)
        return json.loads(result.stdout)

    org = cli("orgs", "create", "--name", "Docs Clinic", "--ehr", "sandbox")
    app = cli("apps", "create", "--name", "Docs App", "--redirect-uri", "https://docs-app.example/app",
              "--launch-url", "https://docs-app.example/launch")
    cli("installs", "create", "--app", app["application_id"], "--org", org["id"])
    proc = start_process(["serve", "--port", str(port)], env, port, log_path=tmp / "serve.log")
    try:
        yield {"url": url, "app": app, "org": org}
    finally:
        stop_process(proc)


@pytest.fixture
def docs_page(tmp_path):
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser.new_page(viewport={"width": 1280, "height": 900})
        finally:
            browser.close()


def test_docs_render_every_operation_and_try_one_with_client_credentials(service, docs_page):
    requested = []
    docs_page.on("request", lambda request: requested.append(request.url))
    console_errors = []
    docs_page.on("console", lambda message: message.type == "error" and console_errors.append(message.text))
    docs_page.goto(service["url"] + "/v1/docs")
    docs_page.wait_for_selector(".opblock", timeout=TIMEOUT_MS)
    operation_ids = {op["operationId"] for item in openapi_document(service["url"])["paths"].values()
                     for op in item.values()}
    assert docs_page.locator(".opblock").count() == len(operation_ids)

    # Authorize with the app's client credentials (Swagger UI posts them to the scheme's tokenUrl).
    docs_page.click("button.authorize")
    docs_page.fill("#client_id_clientCredentials", service["app"]["client_id"])
    docs_page.fill("#client_secret_clientCredentials", service["app"]["client_secret"])
    docs_page.locator(".auth-container", has=docs_page.locator("#client_id_clientCredentials")).locator(
        "button.authorize").click()
    docs_page.locator(".auth-container button", has_text="Logout").wait_for(timeout=TIMEOUT_MS)  # token obtained
    docs_page.locator(".modal-ux button.close-modal").click()

    # Try it out: the app's organizations.
    operation = docs_page.locator("#operations-partner-organizations")
    operation.locator(".opblock-summary").click()
    operation.locator("button.try-out__btn").click()
    operation.locator("input[placeholder='applicationId']").fill(service["app"]["application_id"])
    operation.locator("button.execute").click()
    status = operation.locator(".live-responses-table tbody .response-col_status").first
    status.wait_for(timeout=TIMEOUT_MS)
    assert status.inner_text().strip() == "200"
    assert service["org"]["id"] in operation.locator(".live-responses-table .microlight").first.inner_text()

    # Nothing left this origin: no CDN, no online validator.
    assert requested and all(url.startswith(service["url"] + "/") for url in requested), requested
    assert not console_errors, console_errors
