"""The sandbox hub and settings pages over HTTP, on both databases."""
from __future__ import annotations

import re
import urllib.parse

import pytest

from helpers.environment import ROOT
from helpers.hub import sandbox_signin
from lifecycle.applications import install_application, register_application
from lifecycle.organizations import create_organization
from models.application import Installation
from oauth.tokens import SANDBOX_AUDIENCE


def entry_attrs(page: str, application_id: str) -> str:
    match = re.search(r'<button[^>]*id="app-entry-' + re.escape(application_id) + r'"[^>]*>', page)
    assert match, page
    return match.group(0)


async def hub(api, user_id, app=None):
    """The hub as the signed-in `user_id` sees it (signed in through a one-time link)."""
    cookie, location = await sandbox_signin(api, api.runtime, user_id, app)
    return await api.call("GET", location, headers=cookie)


@pytest.mark.gen_test
async def test_hub_lists_the_clinic_apps_and_frames_them_safely(api, world, runtime):
    other_org = create_organization("Elsewhere")
    elsewhere, _ = register_application(runtime, "Not Here", "https://x.example/app", "https://x.example/launch")
    install_application(elsewhere.id, other_org.id)
    status, headers, page = await hub(api, world.physician.id)
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    app = world.app
    assert 'aria-disabled="false"' in entry_attrs(page, app.id)
    assert "Not Here" not in page
    frame = re.search(r'<iframe[^>]*id="app-frame"[^>]*>', page).group(0)
    assert 'sandbox="allow-scripts allow-same-origin allow-forms allow-popups allow-modals"' in frame
    assert "allow-top-navigation" not in frame
    csp = headers["Content-Security-Policy"]
    assert "frame-src 'self' http://127.0.0.1:8888 https://app.example.com;" in csp
    assert "frame-ancestors 'none'" in csp and "script-src 'self';" in csp
    assert headers["X-Frame-Options"] == "DENY"
    # The hub never sees the app's client secret, in clear or hashed.
    assert world.secret not in page and app.client_secret_hash not in page


@pytest.mark.gen_test
async def test_platform_verification_greys_the_app_out_until_it_is_enabled(api, flow, world):
    app, user = world.app, world.physician
    tokens = await flow.tokens()
    status, _, apps = await api.call("GET", "/sandbox/api/apps",
                                      headers={"Authorization": f"Bearer {world.sandbox_token}"})
    assert status == 200 and apps["apps"][0]["openable"] is True and apps["apps"][0]["activation_status"] is None
    # What hub.js does with the token the SDK hands it: introspect it as the platform.
    status, _, result = await api.call("POST", "/v1/oauth/introspect", {"token": tokens["access_token"]},
                                        headers={"Authorization": f"Bearer {world.sandbox_token}"})
    assert status == 200 and result["active"] is True and result["sub"] == user.id
    _, _, page = await hub(api, user.id)
    assert 'aria-disabled="true"' in entry_attrs(page, app.id)
    _, _, apps = await api.call("GET", "/sandbox/api/apps",
                                headers={"Authorization": f"Bearer {world.sandbox_token}"})
    assert apps["apps"][0] == {**apps["apps"][0], "openable": False, "activation_status": "Disabled"}
    status, _, body = await api.call("POST", "/v1/sandbox/launches", {"client_id": app.client_id},
                                      headers={"Authorization": f"Bearer {world.sandbox_token}"})
    assert status == 403 and body["error"] == "application_disabled"
    Installation.update(activation_status="Enabled").where(Installation.application == app.id).execute()
    _, _, page = await hub(api, user.id)
    assert 'aria-disabled="false"' in entry_attrs(page, app.id)
    assert await flow.launch()


@pytest.mark.gen_test
async def test_deep_link_names_the_app_to_open(api, world, runtime):
    status, _, page = await hub(api, world.physician.id, app=world.app.id)
    assert status == 200
    assert f'"openApp": "{world.app.id}"' in page


@pytest.mark.gen_test
async def test_only_the_sign_in_link_s_own_redirect_opens_an_app_at_once(api, world, runtime):
    """Any site could send a signed-in browser to `/sandbox/hub?app=X` (the Lax cookie goes along on
    a top-level GET) and the hub opened the app at once: a launch, an authorization and the
    installation's first verification, with no click. Only the sign-in link's redirect, marked for
    that browser's session, opens it now; otherwise the hub just lists it."""
    cookie, location = await sandbox_signin(api, runtime, world.physician.id, world.app.id)
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(location).query)
    assert query["app"] == [world.app.id] and query["open"]
    assert f'"openApp": "{world.app.id}"' in (await api.call("GET", location, headers=cookie))[2]
    other_cookie, other_location = await sandbox_signin(api, runtime, world.physician.id, world.app.id)
    for forged in (f"/sandbox/hub?app={world.app.id}", f"/sandbox/hub?app={world.app.id}&open=x",
                   other_location):  # another browser's mark
        status, _, page = await api.call("GET", forged, headers=cookie)
        assert status == 200 and '"openApp": null' in page, forged


@pytest.mark.gen_test
async def test_the_hub_s_appointments_are_a_disclosure_to_the_physician(api, world, runtime):
    """The hub page lists the physician's upcoming appointments (patients' names, visit reasons),
    read from the clinic's EHR: each read is an `ehr.fetch` record naming the physician and every
    patient on the page (it left no record)."""
    from models.disclosures import DisclosureRecord
    status, _, page = await hub(api, world.physician.id)
    shown = set(re.findall(r'data-patient-id="([^"]+)"', page))
    assert status == 200 and shown, page
    records = list(DisclosureRecord.select().where((DisclosureRecord.action == "ehr.fetch")
                                                   & (DisclosureRecord.user_id == world.physician.id)))
    assert records and all(r.organization_id == world.org.id for r in records)
    assert shown <= {p for r in records for p in r.patients}


@pytest.mark.gen_test
async def test_settings_page_shows_a_30_minute_sandbox_token(api, world, runtime):
    cookie, location = await sandbox_signin(api, runtime, world.staff.id, target="settings")
    assert location == "/sandbox/settings"
    status, headers, page = await api.call("GET", location, headers=cookie)
    assert status == 200 and headers["Cache-Control"] == "no-store"
    token = re.search(r'<textarea id="sandbox-token"[^>]*>([^<]+)</textarea>', page).group(1).strip()
    claims = runtime.tokens.verify(token, SANDBOX_AUDIENCE)
    assert claims["sub"] == world.staff.id and claims["exp"] - claims["iat"] == runtime.settings.sandbox_token_ttl
    assert "Valid for 30 minutes" in page
    status, _, body = await api.call("POST", "/v1/sandbox/launches", {"client_id": world.app.client_id},
                                      headers={"Authorization": f"Bearer {token}"})
    assert status == 201 and body["launch_url"].startswith("https://app.example.com/launch?launch_id=")


@pytest.mark.gen_test
async def test_bad_hub_requests_get_clear_errors(api, world):
    status, headers, body = await api.call("GET", "/sandbox/api/apps", headers={"Authorization": "Bearer nope"})
    assert status == 401 and body == {"error": "invalid_token", "message": "Authentication failed"}


@pytest.mark.gen_test
async def test_the_sdk_and_hub_assets_are_served(api, runtime):
    status, headers, body = await api.call("GET", "/static/sdk/svc-sdk.js")
    assert status == 200 and "javascript" in headers["Content-Type"]
    assert "initializeSvcSDK" in body and "loadSdk" in body
    # The served file is the SDK package's committed browser build (sdk/js/dist/), byte for byte.
    assert body.encode() == (ROOT / "sdk" / "js" / "dist" / "svc-sdk.js").read_bytes()
    status, headers, body = await api.call("GET", "/static/sdk/svc-sdk.mjs")
    assert status == 200 and "export {" in body
    status, _, _ = await api.call("GET", "/static/hub/hub.js")
    assert status == 200
    # Nothing outside the two directories: not the package's sources, not the repository.
    for path in ("/static/sdk/..%2Fpackage.json", "/static/sdk/..%2F..%2F..%2Fsetup.py", "/static/..%2Fsetup.py",
                 "/static/sdk/nope.js"):
        status, _, _ = await api.call("GET", path)
        assert status in (403, 404), path


def hub_data(page: str) -> dict:
    import json
    return json.loads(re.search(r'<script id="hub-data" type="application/json">(.*?)</script>', page, re.S).group(1))


def csp_directives(csp: str) -> dict[str, str]:
    """The directive names of a policy (as a browser splits it, on `;`) and their values."""
    parts = [d.strip().split(None, 1) for d in csp.split(";") if d.strip()]
    return {p[0].lower(): (p[1] if len(p) > 1 else "") for p in parts}


@pytest.mark.gen_test
async def test_an_app_s_registered_urls_cannot_add_directives_to_the_hub_s_csp(api, world, runtime):
    """A launch URL or redirect base with a backslash in its host part passes the manifest rule
    (browsers read `\\` as `/`), and the hub put its origin, backslash and all, into its CSP:
    `https://app.example.com\\;sandbox/launch` gave the hub page a `sandbox` directive, so the
    hub's own script no longer ran for anyone in the clinics the app is installed in. The hub
    takes each origin from the URL as the browser follows it."""
    from lifecycle.manifest import update_manifest
    update_manifest(runtime, world.app.id, "developer:dev@app.example",
                    launch_url="https://app.example.com\\;sandbox/launch",
                    redirect_uri="https://app.example.com\\;upgrade-insecure-requests/main")
    status, headers, page = await hub(api, world.physician.id)
    assert status == 200
    directives = csp_directives(headers["Content-Security-Policy"])
    assert set(directives) == {"default-src", "script-src", "style-src", "img-src", "connect-src", "frame-src",
                               "frame-ancestors", "base-uri", "form-action", "object-src"}, directives
    assert directives["frame-src"] == "'self' http://127.0.0.1:8888 https://app.example.com"
    entry = hub_data(page)["apps"][0]
    assert (entry["app_origin"], entry["launch_origin"]) == ("https://app.example.com", "https://app.example.com")


@pytest.mark.gen_test
async def test_the_hub_names_each_app_s_origin_as_the_browser_does(api, world, runtime):
    """hub.js accepts the SDK's messages only from `app_origin`, compared with `event.origin`, which
    a browser serialises in lower case without a default port. A redirect base registered as
    `https://App.Example.com:443/main` (which the manifest and authorize rules accept) gave
    `https://App.Example.com:443`, so the hub ignored every message of the app: it never started."""
    from lifecycle.manifest import update_manifest
    update_manifest(runtime, world.app.id, "operator", redirect_uri="https://App.Example.COM:443/main",
                    launch_url="HTTPS://APP.example.com:443/launch")
    status, headers, page = await hub(api, world.physician.id)
    entry = hub_data(page)["apps"][0]
    assert (entry["app_origin"], entry["launch_origin"]) == ("https://app.example.com", "https://app.example.com")
    assert csp_directives(headers["Content-Security-Policy"])["frame-src"] == \
        "'self' http://127.0.0.1:8888 https://app.example.com"


@pytest.mark.gen_test
async def test_the_hub_frames_and_hears_every_exact_redirect_uri_s_origin(api, world, runtime, flow):
    """An app registered with several exact redirect URIs on several origins (a multi-tenant app's
    `https://clinic-1.app.example/cb`, ...) is sent by authorize to any of them, but the hub framed
    and heard only the manifest's first: its CSP `frame-src` blocked the redirect to the others (a
    blank frame) and hub.js dropped the SDK's messages from them. Every registered origin is framed
    and listed in `app_origins`, the manifest's first; a prefix-mode app keeps its one origin."""
    from lifecycle.applications import set_redirect_policy
    from lifecycle.manifest import update_manifest
    update_manifest(runtime, world.app.id, "operator", redirect_uri="https://clinic-1.app.example/cb")
    set_redirect_policy(runtime, world.app.id, "exact",
                        ["https://clinic-1.app.example/cb", "https://Clinic-2.App.Example:443/cb",
                         "https://clinic-1.app.example/other"])
    status, headers, page = await hub(api, world.physician.id)
    assert status == 200
    entry = hub_data(page)["apps"][0]
    assert entry["app_origin"] == "https://clinic-1.app.example"
    assert entry["app_origins"] == ["https://clinic-1.app.example", "https://clinic-2.app.example"]
    assert csp_directives(headers["Content-Security-Policy"])["frame-src"] == \
        "'self' http://127.0.0.1:8888 https://app.example.com https://clinic-1.app.example https://clinic-2.app.example"
    status, headers, _ = await flow.authorize(redirect_uri="https://clinic-2.app.example/cb")
    assert status == 302 and headers["Location"].startswith("https://clinic-2.app.example/cb?code=")
    status, _, body = await api.call("GET", "/sandbox/api/apps",
                                     headers={"Authorization": f"Bearer {hub_data(page)['sandboxToken']}"})
    assert status == 200 and body["apps"][0]["app_origins"] == entry["app_origins"]
    set_redirect_policy(runtime, world.app.id, "prefix")
    status, headers, page = await hub(api, world.physician.id)
    assert hub_data(page)["apps"][0]["app_origins"] == ["https://clinic-1.app.example"]


@pytest.mark.gen_test
async def test_sign_out_takes_the_service_s_origin_however_svc_public_url_spells_it(api, world, runtime):
    """The sign-out's Origin check compared the browser's `Origin` with SVC_PUBLIC_URL's text: set
    as `http://AUTH.example.com:80`, every sign-out from the hub's own page was refused (403)."""
    runtime.settings = runtime.settings.replace(public_url="http://AUTH.example.com:80")
    cookie, _ = await sandbox_signin(api, runtime, world.physician.id)
    status, headers, _ = await api.call("POST", "/sandbox/signout", body="",
                                        headers={**cookie, "Origin": "http://auth.example.com"})
    assert status == 302 and headers["Location"] == "/sandbox/signin"
    status, _, _ = await api.call("POST", "/sandbox/signout", body="",
                                  headers={**cookie, "Origin": "http://auth.example.com:8080"})
    assert status == 403


@pytest.mark.gen_test
async def test_sign_out_follows_sec_fetch_site_before_origin(api, world, runtime):
    """A browser's own form, posted from a no-referrer page, says `Origin: null` and
    `Sec-Fetch-Site: same-origin`: the sign-out went through only with the service's Origin."""
    for fetch_site in ("cross-site", "same-site"):
        cookie, _ = await sandbox_signin(api, runtime, world.physician.id)
        status, headers, _ = await api.call("POST", "/sandbox/signout", body="", headers={
            **cookie, "Origin": runtime.settings.public_url, "Sec-Fetch-Site": fetch_site})
        assert status == 403 and "Set-Cookie" not in headers, fetch_site
    status, _, _ = await api.call("POST", "/sandbox/signout", body="", headers={**cookie, "Origin": "null"})
    assert status == 403  # no Sec-Fetch-Site: `null` is no proof of the service's page
    status, headers, _ = await api.call("POST", "/sandbox/signout", body="", headers={
        **cookie, "Origin": "null", "Sec-Fetch-Site": "same-origin"})
    assert status == 302 and headers["Location"] == "/sandbox/signin"
    assert (await api.call("GET", "/sandbox/hub", headers=cookie))[0] == 302
