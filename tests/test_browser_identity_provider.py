"""getIdToken() in the identity-provider variant, in headless Chromium through the hub.

The example app's launch URL asks for that variant (`?variant=identity-provider`): its page
exchanges the code through its own backend and calls `initializeSvcSDK({accessToken})` with the
access token alone. The SDK must resolve the very ID token the service issued with that access
token, which only the platform learns (verifying the token with the user's sandbox token)."""
from __future__ import annotations

import json

import pytest

from runtime import Runtime
from cli.demo_seed import DEMO_PHYSICIAN_ID
from models.application import Application
from helpers.browser import APP_ID, app_frame

pytestmark = pytest.mark.browser


def set_launch_url(demo, url: str) -> None:
    runtime = Runtime(demo.settings)
    try:
        Application.update(launch_url=url).where(Application.id == APP_ID).execute()
    finally:
        runtime.close()


def test_identity_provider_variant_resolves_the_id_token_issued_with_the_access_token(demo, page):
    demo.set_status("Enabled")
    set_launch_url(demo, f"{demo.app_url}/launch?variant=identity-provider")
    try:
        page.goto(demo.signin(DEMO_PHYSICIAN_ID, APP_ID))
        frame = app_frame(page)
        assert frame.locator("#sdk-error").inner_text() == ""
        issued = frame.locator("#backend-id-token").text_content()
        resolved = frame.locator("#sdk-id-token").text_content()
        assert issued.count(".") == 2 and resolved == issued
        claims = json.loads(frame.locator("#id-token-claims").inner_text())
        assert claims["sub"] == DEMO_PHYSICIAN_ID and claims["aud"] == "demo-partner-app"
        page.locator("#hub-status").filter(has_text="verified").wait_for(timeout=20000)
    finally:
        set_launch_url(demo, f"{demo.app_url}/launch")
