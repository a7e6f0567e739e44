"""The developer console over real HTTP (both database backends): invitations, passwords and
TOTP, sessions, CSRF, the sign-in throttle, isolation between partners, and the manifest rule
(`lifecycle.manifest`) as authorize and userinfo see it."""
from __future__ import annotations

import json
import subprocess
import sys

import pyotp
import pytest

from helpers.console import PASSWORD, ConsoleClient, developer, invite_path
from helpers.environment import ROOT
from helpers.processes import free_port, settings_env, start_process, stop_process
from helpers.throttle import expected_waits, just_before_a_boundary
from ratelimit.failures import build_failure_throttle
from console.accounts import check_credentials, invite_developer, sign_in
from lifecycle.manifest import ManifestInvalid, update_manifest
from lifecycle.applications import install_application, register_application
from lifecycle.organizations import create_organization, update_organization
from models.application import Application
from models.audit import AuditEvent
from models.developers import ConsoleSession
from errors import ApiError
from oauth.secret_rotation import is_current_secret

@pytest.fixture
def partner_b(runtime):
    org = create_organization("Other Clinic", "sandbox")
    app, _ = register_application(runtime, "Other App", "https://b.example/app", "https://b.example/launch")
    install_application(app.id, org.id)
    return app


# -- the manifest rule -----------------------------------------------------------------------

def test_manifest_update_validates_each_field_and_audits_the_actor(runtime, world):
    app = world.app
    with pytest.raises(ManifestInvalid) as caught:
        update_manifest(runtime, app.id, "developer:a@x.example", name=" ", launch_url="ftp://x", redirect_uri="https://a/#f",
                        token_endpoint="nope", allowed_origins=["https://ok.example", "javascript:alert(1)"],
                        user_fields=["email", "ssn"])
    assert set(caught.value.fields) == {"name", "launch_url", "redirect_uri", "token_endpoint", "allowed_origins",
                                        "user_fields"}
    assert Application.get_by_id(app.id).name == "Test App"  # nothing applied
    updated = update_manifest(runtime, app.id, "developer:a@x.example", name="Renamed", token_endpoint="",
                              user_fields=["name", "email", "email"], allowed_origins=["https://idp.example"])
    assert (updated.name, updated.token_endpoint, updated.user_fields, updated.allowed_origins) == \
        ("Renamed", None, ["email", "name"], ["https://idp.example"])
    event = AuditEvent.select().where(AuditEvent.action == "application.manifest_updated").get()
    assert event.actor == "developer:a@x.example" and event.subject == app.id
    assert event.detail["before"]["name"] == "Test App" and event.detail["after"]["name"] == "Renamed"
    update_manifest(runtime, app.id, "operator", name="Renamed")  # no change: nothing recorded
    assert AuditEvent.select().where(AuditEvent.action == "application.manifest_updated").count() == 1


@pytest.mark.gen_test
async def test_authorize_follows_the_new_base_url_and_userinfo_the_new_permissions(api, flow, world, runtime):
    app = world.app
    update_manifest(runtime, app.id, "operator", redirect_uri="https://new.example/cb", user_fields=["name"])
    status, headers, _ = await flow.authorize(redirect_uri="https://app.example.com/main")
    assert status == 400 and "Location" not in headers  # the old base is refused, never redirected to
    status, headers, _ = await flow.authorize(redirect_uri="https://new.example/cb/done")
    assert status == 302 and headers["Location"].startswith("https://new.example/cb/done?code=")
    world.app = Application.get_by_id(app.id)
    tokens = await flow.tokens()
    status, _, info = await api.call("GET", "/v1/oauth/userinfo", headers={"Authorization": tokens["access_token"]})
    assert status == 200 and "email" not in info and info["given_name"] == "Doc"


def test_apps_update_cli(settings, runtime, world):
    def cli(*args, expect=0):
        result = subprocess.run([sys.executable, "-m", "cli.__main__", *args], env=settings_env(settings),
                                cwd=str(ROOT), capture_output=True, text=True, timeout=60)
        assert result.returncode == expect, result.stderr
        return result
    app_id = world.app.id
    out = json.loads(cli("apps", "update", "--app", app_id, "--redirect-uri", "https://new.example/cb",
                         "--user-fields", "email,organization", "--no-token-endpoint", "--json").stdout)
    assert out["redirect_uri"] == "https://new.example/cb" and out["user_fields"] == ["email", "organization"]
    out = json.loads(cli("apps", "update", "--app", app_id, "--require-pkce", "--redirect-uri-match", "exact",
                         "--json").stdout)
    assert out["require_pkce"] is True and out["redirect_uris"] == ["https://new.example/cb"]
    out = json.loads(cli("apps", "update", "--app", app_id, "--redirect-uri", "https://new.example/v3",
                         "--no-require-pkce", "--json").stdout)
    assert out["require_pkce"] is False and out["redirect_uris"] == ["https://new.example/v3"]  # exact list follows
    assert "launch URL" in cli("apps", "update", "--app", app_id, "--launch-url", "mailto:x", expect=2).stderr
    assert "No application" in cli("apps", "update", "--app", "app_nope", "--name", "x", expect=2).stderr
    invite = json.loads(cli("developers", "invite", "--app", app_id, "--email", "Dev@Partner.example", "--json").stdout)
    assert invite["invite_url"].startswith(settings.public_url + "/console/invite/")
    assert invite["email"] == "dev@partner.example"
    cli("developers", "invite", "--app", app_id, "--email", "not-an-email", expect=2)


# -- accounts and pages ------------------------------------------------------------------------

@pytest.mark.gen_test(timeout=60)
async def test_invite_set_password_sign_in_pages_and_sign_out(http_client, base_url, runtime, world):
    app = world.app
    client = ConsoleClient(http_client, base_url)
    assert (await client.get("/console")).headers["Location"] == "/console/login"
    path = invite_path(runtime, app.id, "dev@partner.example")
    page = await client.get(path)
    assert page.code == 200 and "Confirm password" in client.last_html and "Set password" in client.last_html
    short = await client.post(path, {"password": "short", "confirm": "short"})
    assert short.code == 400 and 'id="password-error"' in client.last_html
    differ = await client.post(path, {"password": PASSWORD, "confirm": PASSWORD + "x"})
    assert differ.code == 400 and 'id="confirm-error"' in client.last_html
    assert (await client.post(path, {"password": PASSWORD, "confirm": PASSWORD})).code == 303
    assert (await client.get(path)).code == 404  # one-time link
    assert (await client.sign_in("dev@partner.example", "wrong password!")).code == 401
    signed_in = await client.sign_in("DEV@partner.example", PASSWORD)
    assert signed_in.code == 303
    set_cookie = ";".join(signed_in.headers.get_list("Set-Cookie")).lower()
    assert "svc_console=" in set_cookie and "httponly" in set_cookie and "samesite=lax" in set_cookie
    home = await client.get("/console")
    assert home.code == 200 and f'href="/console/apps/{app.id}">Test App</a>' in client.last_html
    for suffix in ("", "/installations", "/billing", "/billing?month=2026-01", "/audit"):
        response = await client.get(f"/console/apps/{app.id}{suffix}")
        assert response.code == 200, (suffix, client.last_html)
        if suffix == "/installations":  # which EHR each clinic is on
            assert "<td>Sandbox EHR</td>" in client.last_html
            update_organization(world.org.id, ehr="fhir", ehr_url="https://ehr.example.com/fhir/R4",
                                fhir_client_id="svc-auth")
            await client.get(f"/console/apps/{app.id}{suffix}")
            assert "<td>FHIR R4 (ehr.example.com)</td>" in client.last_html
            update_organization(world.org.id, fhir_profile="epic")      # the vendor profile, shown read-only
            await client.get(f"/console/apps/{app.id}{suffix}")
            assert "<td>FHIR R4 (ehr.example.com, Epic profile)</td>" in client.last_html
    assert "Installations" in client.last_html and "developer.password_set" in client.last_html
    bad_month = await client.get(f"/console/apps/{app.id}/billing?month=2026-13")
    assert bad_month.code == 400 and 'id="month-error"' in client.last_html
    csv_response = await client.get(f"/console/apps/{app.id}/billing.csv?month=2026-01")
    assert csv_response.code == 200 and client.last_html.startswith("month,application_id")
    # A second invitation (another application) grants access; it cannot reset the password.
    second, _ = register_application(runtime, "Second App", "https://two.example/app", "https://two.example/launch")
    again = invite_path(runtime, second.id, "dev@partner.example")
    assert (await client.get(again)).code == 200 and "already have an account" in client.last_html
    reset = await client.post(again, {"password": "another password!", "confirm": "another password!"})
    assert reset.code == 409 and check_credentials(runtime, "dev@partner.example", PASSWORD)
    await client.get("/console")
    assert "Second App" in client.last_html and "Test App" in client.last_html
    out = await client.post("/console/logout")
    assert out.code == 303 and "svc_console" not in client.cookies
    assert (await client.get(f"/console/apps/{app.id}")).code == 302


@pytest.mark.gen_test(timeout=60)
async def test_sign_in_takes_the_e_mail_as_the_invitation_stored_it(http_client, base_url, runtime, world):
    """An invitation stores the e-mail NFKC-normalised (`lifecycle.users.clean_email`), so sign-in
    reads the typed one the same way: a developer invited as `Ｄｅｖ@partner.example` (fullwidth)
    signs in typing it so or in ASCII, and its failures count against the one account."""
    client = await developer(http_client, base_url, runtime, world.app.id, "\uff24\uff45\uff56@partner.example")
    assert (await client.get("/console")).code == 200
    assert (await ConsoleClient(http_client, base_url).sign_in("dev@partner.example", PASSWORD)).code == 303
    assert check_credentials(runtime, "\uff44\uff45\uff56@PARTNER.example", PASSWORD) is not None
    from console.accounts import signin_subject
    assert signin_subject("\uff24\uff45\uff56@partner.example") == signin_subject("dev@partner.example")


@pytest.mark.gen_test(timeout=60)
async def test_manifest_form_errors_beside_fields_and_secret_steps(http_client, base_url, runtime, world):
    app = world.app
    client = await developer(http_client, base_url, runtime, app.id, "dev@partner.example")
    await client.get(f"/console/apps/{app.id}")
    form = [("name", "Test App"), ("launch_url", "https://app.example.com/launch"),
            ("redirect_uri", "not a url"), ("token_endpoint", ""), ("allowed_origins", ""),
            ("user_fields", "email")]
    bad = await client.post(f"/console/apps/{app.id}", form)
    assert bad.code == 400 and 'id="redirect_uri-error"' in client.last_html and 'value="not a url"' in client.last_html
    form[2] = ("redirect_uri", "https://app.example.com/v2")
    assert (await client.post(f"/console/apps/{app.id}", form)).code == 303
    assert Application.get_by_id(app.id).redirect_uri == "https://app.example.com/v2"

    await client.get(f"/console/apps/{app.id}")
    generated = await client.post(f"/console/apps/{app.id}/secret/fallback")
    assert generated.code == 200 and 'id="fallback-secret"' in client.last_html
    import re
    fallback = re.search(r'id="fallback-secret" type="text" readonly value="([^"]+)"', client.last_html).group(1)
    stored = Application.get_by_id(app.id)
    assert is_current_secret(stored, world.secret, runtime.hasher) and not is_current_secret(stored, fallback, runtime.hasher)
    await client.get(f"/console/apps/{app.id}")
    assert fallback not in client.last_html  # shown once
    ask = await client.post(f"/console/apps/{app.id}/secret/activate")
    assert ask.code == 200 and "breaks integrations" in client.last_html and "Confirm activation" in client.last_html
    assert is_current_secret(Application.get_by_id(app.id), world.secret, runtime.hasher)  # not yet
    done = await client.post(f"/console/apps/{app.id}/secret/activate", {"confirm": "yes"})
    assert done.code == 303
    assert is_current_secret(Application.get_by_id(app.id), fallback, runtime.hasher)
    actors = {(e.action, e.actor) for e in AuditEvent.select().where(AuditEvent.subject == app.id)}
    assert {("application.manifest_updated", "developer:dev@partner.example"),
            ("application.secret.fallback_generated", "developer:dev@partner.example"),
            ("application.secret.fallback_activated", "developer:dev@partner.example")} <= actors


@pytest.mark.gen_test(timeout=60)
async def test_totp_second_factor(http_client, base_url, runtime, world):
    client = ConsoleClient(http_client, base_url)
    path = invite_path(runtime, world.app.id, "otp@partner.example")
    await client.get(path)
    import re
    secret = re.search(r'id="totp-secret">([A-Z2-7]+)<', client.last_html).group(1)
    wrong = await client.post(path, {"password": PASSWORD, "confirm": PASSWORD, "totp_code": "000000"})
    assert wrong.code == 400 and 'id="totp-error"' in client.last_html
    code = pyotp.TOTP(secret).at(runtime.clock.time())
    assert (await client.post(path, {"password": PASSWORD, "confirm": PASSWORD, "totp_code": code})).code == 303
    assert (await client.sign_in("otp@partner.example", PASSWORD)).code == 401
    # An authenticator code is good once (RFC 6238 5.2): the one that set the factor up is spent,
    # the next step's code signs in, and replaying it from another browser does not.
    assert (await client.sign_in("otp@partner.example", PASSWORD, code)).code == 401
    runtime.clock.advance(30)
    fresh = pyotp.TOTP(secret).at(runtime.clock.time())
    assert (await client.sign_in("otp@partner.example", PASSWORD, fresh)).code == 303
    replay = ConsoleClient(http_client, base_url)
    assert (await replay.sign_in("otp@partner.example", PASSWORD, fresh)).code == 401


def _dumped(runtime) -> str:
    """Every row of the console's account tables as a database dump shows them."""
    return "\n".join(repr(row) for table in ("developer", "developer_invite")
                     for row in runtime.db.execute_sql(f'SELECT * FROM "{table}"').fetchall())


@pytest.mark.gen_test(timeout=60)
async def test_a_database_dump_does_not_give_the_totp_secret(http_client, base_url, runtime, world):
    """The authenticator key was stored in clear (invitation and account rows): a dump or a backup
    gave every developer's second factor. It is sealed under SVC_HMAC_KEY; an account whose key an
    earlier release stored in clear still signs in, and `keys rekey` seals it."""
    import re
    from keys.rekey import rekey
    from models.developers import Developer
    client = ConsoleClient(http_client, base_url)
    path = invite_path(runtime, world.app.id, "otp@partner.example")
    await client.get(path)
    secret = re.search(r'id="totp-secret">([A-Z2-7]+)<', client.last_html).group(1)
    assert secret not in _dumped(runtime)
    code = pyotp.TOTP(secret).at(runtime.clock.time())
    assert (await client.post(path, {"password": PASSWORD, "confirm": PASSWORD, "totp_code": code})).code == 303
    assert secret not in _dumped(runtime)
    runtime.clock.advance(30)
    assert (await ConsoleClient(http_client, base_url).sign_in(
        "otp@partner.example", PASSWORD, pyotp.TOTP(secret).at(runtime.clock.time()))).code == 303

    Developer.update(totp_secret=secret).where(Developer.email == "otp@partner.example").execute()  # an earlier release's row
    runtime.clock.advance(30)
    assert (await ConsoleClient(http_client, base_url).sign_in(
        "otp@partner.example", PASSWORD, pyotp.TOTP(secret).at(runtime.clock.time()))).code == 303
    assert rekey(runtime)["still_old"]["totp_secrets"] == 0
    assert secret not in _dumped(runtime)
    runtime.clock.advance(30)
    assert (await ConsoleClient(http_client, base_url).sign_in(
        "otp@partner.example", PASSWORD, pyotp.TOTP(secret).at(runtime.clock.time()))).code == 303


@pytest.mark.gen_test(timeout=60)
async def test_a_totp_code_that_is_not_ascii_is_wrong_not_a_500(http_client, base_url, runtime, world):
    """`hmac.compare_digest` raises on non-ASCII text: anyone holding an invitation link (and a
    developer with a TOTP factor, at sign-in) got a 500 for a code such as `é` or `١٢٣٤٥٦`."""
    client = ConsoleClient(http_client, base_url)
    path = invite_path(runtime, world.app.id, "otp@partner.example")
    await client.get(path)
    import re
    secret = re.search(r'id="totp-secret">([A-Z2-7]+)<', client.last_html).group(1)
    for junk in ("\u00e9", "\u0661\u0662\u0663\u0664\u0665\u0666", "\U0001f511" * 6):
        wrong = await client.post(path, {"password": PASSWORD, "confirm": PASSWORD, "totp_code": junk})
        assert wrong.code == 400 and 'id="totp-error"' in client.last_html, (junk, wrong.code)
    code = pyotp.TOTP(secret).at(runtime.clock.time())
    assert (await client.post(path, {"password": PASSWORD, "confirm": PASSWORD, "totp_code": code})).code == 303
    runtime.clock.advance(30)
    assert (await client.sign_in("otp@partner.example", PASSWORD, "\u00e9\u00e9\u00e9")).code == 401
    fresh = pyotp.TOTP(secret).at(runtime.clock.time())
    assert (await client.sign_in("otp@partner.example", PASSWORD, fresh)).code == 303


@pytest.mark.gen_test(timeout=60)
async def test_idle_session_expires(http_client, base_url, runtime, world):
    client = await developer(http_client, base_url, runtime, world.app.id, "dev@partner.example")
    assert (await client.get("/console")).code == 200
    runtime.clock.advance(runtime.settings.console_idle_timeout - 60)
    assert (await client.get("/console")).code == 200  # activity keeps it alive
    runtime.clock.advance(runtime.settings.console_idle_timeout + 1)
    assert (await client.get("/console")).headers["Location"] == "/console/login"


@pytest.mark.gen_test(timeout=120)
async def test_a_busy_session_ends_at_its_absolute_lifetime(http_client, base_url, runtime, world):
    client = await developer(http_client, base_url, runtime, world.app.id, "dev@partner.example")
    lifetime = runtime.settings.console_session_lifetime
    await client.keep_busy(runtime, lifetime - 60)  # used a minute before the lifetime ends
    runtime.clock.advance(120)  # a minute past it: used a minute ago, not idle
    refused = await client.get("/console")
    assert refused.code == 302 and refused.headers["Location"] == "/console/login"
    assert "svc_console" not in client.cookies and ConsoleSession.select().count() == 0  # ended, not just refused
    assert (await client.sign_in("dev@partner.example", PASSWORD)).code == 303  # a new sign-in starts a new one
    assert (await client.get("/console")).code == 200


@pytest.mark.gen_test(timeout=60)
@pytest.mark.svc_settings(console_session_lifetime=600)
async def test_the_session_lifetime_is_a_setting(http_client, base_url, runtime, world):
    client = await developer(http_client, base_url, runtime, world.app.id, "dev@partner.example")
    runtime.clock.advance(590)
    assert (await client.get("/console")).code == 200
    runtime.clock.advance(20)  # idle 20 s, signed in 610 s ago
    assert (await client.get("/console")).headers["Location"] == "/console/login"


# -- isolation, CSRF, throttling ---------------------------------------------------------------

@pytest.mark.gen_test(timeout=90)
async def test_a_developer_sees_and_changes_only_their_own_applications(http_client, base_url, runtime, world,
                                                                        partner_b):
    a = await developer(http_client, base_url, runtime, world.app.id, "dev@a.example")
    b = await developer(http_client, base_url, runtime, partner_b.id, "dev@b.example")
    await a.get("/console")
    assert "Test App" in a.last_html and "Other App" not in a.last_html
    await b.get("/console")
    assert "Other App" in b.last_html and "Test App" not in b.last_html
    other_org = Application.get_by_id(partner_b.id).installations.get().organization_id
    for client, foreign in ((a, partner_b.id), (b, world.app.id)):
        for suffix in ("", "/installations", "/billing", "/billing.csv", "/audit"):
            assert (await client.get(f"/console/apps/{foreign}{suffix}")).code == 404, suffix
        await client.get("/console")
        for suffix, form in (("", {"name": "Hijacked", "launch_url": "https://evil.example/l",
                                   "redirect_uri": "https://evil.example/r"}),
                             ("/secret/fallback", {}), ("/secret/activate", {"confirm": "yes"}),
                             (f"/installations/{other_org}/status", {"status": "Enabled"})):
            await client.get("/console")
            assert (await client.post(f"/console/apps/{foreign}{suffix}", form)).code == 404, suffix
    for app_id in (world.app.id, partner_b.id):
        stored = Application.get_by_id(app_id)
        assert stored.name != "Hijacked" and stored.fallback_secret_hash is None
    # Access is checked on every request, not only at sign-in: revoking it takes effect at once.
    from models.developers import DeveloperAccess
    DeveloperAccess.delete().execute()
    assert (await a.get(f"/console/apps/{world.app.id}")).code == 404


@pytest.mark.gen_test(timeout=60)
async def test_a_post_without_the_csrf_token_is_403(api, http_client, base_url, runtime, world):
    app = world.app
    client = await developer(http_client, base_url, runtime, app.id, "dev@partner.example")
    await client.get("/console")
    for path, form in ((f"/console/apps/{app.id}", {"name": "Changed", "launch_url": app.launch_url,
                                                    "redirect_uri": app.redirect_uri}),
                       (f"/console/apps/{app.id}/secret/fallback", {}), ("/console/logout", {}),
                       ("/console/login", {"email": "dev@partner.example", "password": PASSWORD})):
        response = await client.post(path, form, xsrf=False)
        assert response.code == 403, path
    assert "_xsrf" not in client.cookies  # signed in, the token is the session's: no cookie is involved
    stored = Application.get_by_id(app.id)
    assert stored.name == "Test App" and stored.fallback_secret_hash is None
    assert (await client.get("/console")).code == 200  # still signed in: the logout was refused
    # The OAuth and REST endpoints take no CSRF token.
    status, _, body = await api.call("POST", "/v1/oauth/token", {
        "grant_type": "client_credentials", "client_id": app.client_id, "client_secret": world.secret})
    assert status == 200, body


@pytest.mark.gen_test(timeout=60)
async def test_sign_in_and_sign_out_rotate_the_csrf_token(http_client, base_url, runtime, world):
    app = world.app
    client = await developer(http_client, base_url, runtime, app.id, "dev@partner.example")
    await client.get("/console")
    assert (await client.post("/console/logout")).code == 303
    await client.get("/console/login")
    before = client.xsrf()  # known to whoever planted or read it (with its cookie)
    assert client.cookies["_xsrf"]
    signed_in = await client.sign_in("dev@partner.example", PASSWORD)
    assert signed_in.code == 303, client.last_html
    # The sign-in response drops the CSRF cookie with the attributes it was set with.
    dropped = [c for c in signed_in.headers.get_list("Set-Cookie") if c.startswith("_xsrf=")]
    assert len(dropped) == 1 and "path=/console" in dropped[0].lower() and "httponly" in dropped[0].lower(), dropped
    assert (await client.get("/console")).code == 200  # the signed-in page carries the session's token
    assert client.xsrf() != before and "_xsrf" not in client.cookies
    rename = {"name": "Planted", "launch_url": app.launch_url, "redirect_uri": app.redirect_uri}
    assert (await client.post(f"/console/apps/{app.id}", [*rename.items(), ("_xsrf", before)], xsrf=False)).code == 403
    assert (await client.post("/console/logout", {"_xsrf": before}, xsrf=False)).code == 403
    assert Application.get_by_id(app.id).name == "Test App"
    await client.get(f"/console/apps/{app.id}")
    assert (await client.post(f"/console/apps/{app.id}", rename)).code in (200, 303)  # the new page's token works
    assert Application.get_by_id(app.id).name == "Planted"
    # Sign-out rotates it too: a signed-in page's token cannot sign anyone in afterwards.
    await client.get("/console")
    signed_in_token = client.xsrf()
    assert (await client.post("/console/logout")).code == 303
    again = await client.post("/console/login", {"email": "dev@partner.example", "password": PASSWORD,
                                                 "_xsrf": signed_in_token}, xsrf=False)
    assert again.code == 403 and "svc_console" not in client.cookies
    assert (await client.sign_in("dev@partner.example", PASSWORD)).code == 303


@pytest.mark.gen_test(timeout=60)
async def test_a_planted_csrf_cookie_and_a_form_token_to_match_are_refused_when_signed_in(
        http_client, base_url, runtime, world):
    """A sibling host of the parent domain can set an `_xsrf` cookie the console cannot clear (for
    the parent domain, or a longer path) and post a form token to match: the double-submit check
    alone passes that. Signed in, only the session's own token is accepted."""
    app = world.app
    client = await developer(http_client, base_url, runtime, app.id, "dev@partner.example")
    attacker = ConsoleClient(http_client, base_url)  # a valid pair of Tornado's, from its own visit
    await attacker.get("/console/login")
    pairs = (("planted", "planted"), (attacker.cookies["_xsrf"], attacker.xsrf()))
    rename = {"name": "Forged", "launch_url": app.launch_url, "redirect_uri": app.redirect_uri}
    for cookie, token in pairs:
        await client.get(f"/console/apps/{app.id}")
        client.cookies["_xsrf"] = cookie
        for path, form in ((f"/console/apps/{app.id}", rename), (f"/console/apps/{app.id}/secret/fallback", {}),
                           (f"/console/apps/{app.id}/installations/{world.org.id}/status", {"status": "Enabled"}),
                           ("/console/logout", {})):
            response = await client.post(path, {**form, "_xsrf": token}, xsrf=False)
            assert response.code == 403, (path, cookie)
            assert "wrong CSRF token" in client.last_html
    stored = Application.get_by_id(app.id)
    assert stored.name == "Test App" and stored.fallback_secret_hash is None
    assert stored.installations.get().activation_status is None
    assert (await client.get(f"/console/apps/{app.id}")).code == 200  # still signed in: the sign-out was refused
    assert (await client.post(f"/console/apps/{app.id}", rename)).code in (200, 303)  # the page's own token works
    assert Application.get_by_id(app.id).name == "Forged"


@pytest.mark.gen_test(timeout=90)
async def test_the_csrf_token_of_another_session_is_refused(http_client, base_url, runtime, world):
    app = world.app
    a = await developer(http_client, base_url, runtime, app.id, "dev@a.example")
    b = await developer(http_client, base_url, runtime, app.id, "dev@b.example")  # the same application
    a_again = ConsoleClient(http_client, base_url)  # a second session of the same developer
    assert (await a_again.sign_in("dev@a.example", PASSWORD)).code == 303
    rename = {"name": "Renamed", "launch_url": app.launch_url, "redirect_uri": app.redirect_uri}
    for other in (b, a_again):
        await other.get(f"/console/apps/{app.id}")
        await a.get(f"/console/apps/{app.id}")
        assert other.xsrf() != a.xsrf()
        refused = await a.post(f"/console/apps/{app.id}", {**rename, "_xsrf": other.xsrf()}, xsrf=False)
        assert refused.code == 403
    assert Application.get_by_id(app.id).name == "Test App"
    await a.get(f"/console/apps/{app.id}")
    assert (await a.post(f"/console/apps/{app.id}", rename)).code in (200, 303)
    assert Application.get_by_id(app.id).name == "Renamed"


@pytest.mark.gen_test(timeout=60)
async def test_sign_out_ends_the_sessions_csrf_token(http_client, base_url, runtime, world):
    app = world.app
    client = await developer(http_client, base_url, runtime, app.id, "dev@partner.example")
    await client.get(f"/console/apps/{app.id}")
    token, session = client.xsrf(), client.cookies["svc_console"]
    assert (await client.post("/console/logout")).code == 303 and "svc_console" not in client.cookies
    rename = {"name": "Late", "launch_url": app.launch_url, "redirect_uri": app.redirect_uri, "_xsrf": token}
    client.cookies["svc_console"] = session  # the ended session's cookie, replayed: the sign-in page, nothing changed
    replayed = await client.post(f"/console/apps/{app.id}", rename, xsrf=False)
    assert replayed.code == 303 and replayed.headers["Location"] == "/console/login"
    assert (await client.sign_in("dev@partner.example", PASSWORD)).code == 303  # a new session
    assert (await client.post(f"/console/apps/{app.id}", rename, xsrf=False)).code == 403
    assert (await client.post("/console/logout", {"_xsrf": token}, xsrf=False)).code == 403
    assert Application.get_by_id(app.id).name == "Test App"
    assert (await client.get("/console")).code == 200


@pytest.mark.gen_test(timeout=300)
async def test_a_page_served_before_an_hmac_key_rotation_still_posts(http_client, settings, runtime, world,
                                                                     tmp_path):
    """Real `serve` processes restarted through the rotation (docs/operations.md): a form on a page
    the old key served still posts; pages served after it carry the new key's token, which works."""
    app, old, new = world.app, settings.hmac_key, "n" * 40

    def serve(name: str, **keys):
        port = free_port()
        env = settings_env(settings, SVC_VAR_DIR=tmp_path / name, SVC_KEYS_DIR=tmp_path / name / "keys", **keys)
        return port, start_process(["serve", "--port", str(port)], env, port, log_path=tmp_path / f"{name}.log")

    port, proc = serve("old")
    try:
        client = await developer(http_client, f"http://127.0.0.1:{port}", runtime, app.id, "dev@partner.example")
        await client.get(f"/console/apps/{app.id}")
        token = client.xsrf()
    finally:
        stop_process(proc)
    port, proc = serve("rotated", SVC_HMAC_KEY=new, SVC_HMAC_KEY_PREVIOUS=old)
    try:
        client.base_url = f"http://127.0.0.1:{port}"
        rename = {"launch_url": app.launch_url, "redirect_uri": app.redirect_uri}
        assert (await client.post(f"/console/apps/{app.id}", {**rename, "name": "Old page"})).code in (200, 303)
        assert Application.get_by_id(app.id).name == "Old page"
        await client.get(f"/console/apps/{app.id}")
        assert client.xsrf() != token
        assert (await client.post(f"/console/apps/{app.id}", {**rename, "name": "New page"})).code in (200, 303)
        assert Application.get_by_id(app.id).name == "New page"
    finally:
        stop_process(proc)


@pytest.mark.gen_test(timeout=90)
async def test_sign_in_throttle_per_account_and_per_address(http_client, base_url, runtime, world):
    """The count slides: failures just before what was a fixed window's boundary and after it count
    together (a fixed window started afresh at it, and ended a lock there: a CI run once signed in
    with the right password a moment after the 5th failure). The lock lasts until the first of
    them is the window's length old, as Retry-After says, even for the right password."""
    app, clock = world.app, runtime.clock
    await developer(http_client, base_url, runtime, app.id, "dev@partner.example")
    client = ConsoleClient(http_client, base_url)
    limit = runtime.console_signin_policy().subject  # SVC_CONSOLE_SIGNIN_FAILURE_LIMIT
    just_before_a_boundary(clock, limit.seconds, lead=5)
    first = clock.time()
    assert (await client.sign_in("dev@partner.example", "wrong password!")).code == 401
    oldest = (first, clock.time())
    for _ in range(limit.count - 2):
        assert (await client.sign_in("dev@partner.example", "wrong password!")).code == 401
    clock.advance(10)  # past the boundary
    assert (await client.sign_in("dev@partner.example", "wrong password!")).code == 401
    before = clock.time()
    refused = await client.sign_in("dev@partner.example", PASSWORD)  # even the right password
    at = (before, clock.time())
    assert refused.code == 429 and "Too many failed sign-ins" in client.last_html
    wait = int(refused.headers["Retry-After"])
    assert wait in expected_waits(oldest, at, limit.seconds), (wait, oldest, at)
    # The source address (127.0.0.1 here) is throttled too: another account from it is refused.
    assert (await client.sign_in("someone@else.example", "whatever it is")).code == 429
    clock.advance(wait - 60)  # a minute before the lock ends: still locked
    assert (await client.sign_in("dev@partner.example", PASSWORD)).code == 429
    clock.advance(at[1] + wait - clock.time())  # when Retry-After said: the right password signs in
    assert (await client.sign_in("dev@partner.example", PASSWORD)).code == 303, client.last_html


def test_sign_in_throttle_counts_an_account_across_addresses_and_recovers(runtime, world):
    invite_developer(runtime, world.app.id, "dev@partner.example")
    from models.developers import Developer
    import argon2
    Developer.update(password_hash=argon2.PasswordHasher().hash(PASSWORD)).execute()
    # runtime.console_signin_throttle: in memory, these settings have no SVC_REDIS_URL
    limit = runtime.console_signin_policy().subject
    for n in range(limit.count):
        with pytest.raises(ApiError) as caught:
            sign_in(runtime, "dev@partner.example", "bad", "", f"10.0.0.{n}")
        assert caught.value.status == 401
    with pytest.raises(ApiError) as caught:
        sign_in(runtime, "dev@partner.example", PASSWORD, "", "10.0.1.1")
    assert caught.value.status == 429 and caught.value.headers["Retry-After"]
    with pytest.raises(ApiError) as caught:  # another account from another address: not throttled
        sign_in(runtime, "other@partner.example", "bad", "", "10.0.1.2")
    assert caught.value.status == 401
    runtime.clock.advance(limit.seconds + 1)  # every failure is older than the window
    assert sign_in(runtime, "dev@partner.example", PASSWORD, "", "10.0.1.1")
    assert check_credentials(runtime, "dev@partner.example", PASSWORD) is not None


def test_sign_in_throttle_is_shared_through_redis(runtime, world, redis_namespace):
    """Two processes' throttles on one Redis: failures counted by one refuse attempts at the other."""
    from helpers.environment import REDIS_URL
    invite_developer(runtime, world.app.id, "dev@partner.example")
    shared = runtime.settings.replace(redis_url=REDIS_URL, redis_namespace=redis_namespace)

    first, second = (build_failure_throttle(shared, "console_signin", runtime.console_signin_policy(), runtime.clock.time)
                     for _ in range(2))  # what each serve process's runtime builds
    runtime.console_signin_throttle = first
    limit = runtime.console_signin_policy().subject
    for n in range(limit.count):
        with pytest.raises(ApiError):
            sign_in(runtime, "dev@partner.example", "bad", "", f"10.0.0.{n}")
    runtime.console_signin_throttle = second
    with pytest.raises(ApiError) as caught:
        sign_in(runtime, "dev@partner.example", "bad", "", "10.0.9.9")
    assert caught.value.status == 429 and int(caught.value.headers["Retry-After"]) <= limit.seconds


@pytest.mark.gen_test(timeout=60)
async def test_bad_console_input_is_a_4xx_page_never_a_500(http_client, base_url, runtime, world):
    app = world.app
    client = await developer(http_client, base_url, runtime, app.id, "dev@partner.example")
    await client.get(f"/console/apps/{app.id}")
    token = client.xsrf()
    headers = client._headers({"Content-Type": "application/x-www-form-urlencoded"})
    for body in (b"name=%ff%fe&_xsrf=" + token.encode(), b"_xsrf=" + token.encode() + b"&user_fields=" + b"x" * 300):
        response = await http_client.fetch(f"{base_url}/console/apps/{app.id}", method="POST", body=body,
                                           headers=headers, raise_error=False)
        assert 400 <= response.code < 500, response.body[:300]
    for path in ("/console/apps/%00", "/console/apps/" + "a" * 300, "/console/apps/x/installations/%ff/status",
                 f"/console/apps/{app.id}%00/audit"):
        response = await client.get(path)
        assert response.code in (400, 404), path
    await client.get("/console")
    for path, field, code in ((f"/console/apps/{app.id}", "launch_url", 400), ("/console/login", "email", 401)):
        await client.get("/console")
        nul = await client.post(path, {field: "https://a.example/\x00", "name": "x"})
        assert nul.code == code, (path, client.last_html[-500:])
    await client.get("/console")
    nul_org = await client.post(f"/console/apps/{app.id}/installations/org%00/status", {"status": "Enabled"})
    assert nul_org.code == 404
    month = await client.get(f"/console/apps/{app.id}/billing.csv?month=junk")
    assert month.code == 400 and "YYYY-MM" in client.last_html
    status = await client.post(f"/console/apps/{app.id}/installations/{world.org.id}/status", {"status": "On"})
    assert status.code in (400, 409) and 'class="error"' in client.last_html


@pytest.mark.gen_test(timeout=60)
async def test_an_offline_access_lifetime_that_is_no_whole_number_is_refused_beside_its_field(
        http_client, base_url, runtime, world):
    """`str.isdigit` takes "²" and Arabic-Indic digits, and any number of digits: `int()` then
    raised (or refused over 4,300 digits), and the SMART settings form answered 500."""
    app = world.app
    client = await developer(http_client, base_url, runtime, app.id, "dev@partner.example")
    for junk in ("\u00b2", "\u0663\u0666\u0660\u0660", "9" * 5000, "1e4", "-3600"):
        await client.get(f"/console/apps/{app.id}")
        bad = await client.post(f"/console/apps/{app.id}/smart", {
            "smart_scopes": "", "offline_access_ttl": junk})
        assert bad.code == 400 and 'id="offline_access_ttl-error"' in client.last_html, (junk[:8], bad.code)
    assert Application.get_by_id(app.id).offline_access_ttl is None
    await client.get(f"/console/apps/{app.id}")
    good = await client.post(f"/console/apps/{app.id}/smart", {
        "smart_scopes": "", "offline_access_ttl": " 7200 "})
    assert good.code == 303 and Application.get_by_id(app.id).offline_access_ttl == 7200


@pytest.mark.gen_test(timeout=60)
async def test_revoking_a_grant_whose_id_is_no_id_is_a_404(http_client, base_url, runtime, world):
    """The grant id in the Revoke form's path reached the database as it came: on PostgreSQL a NUL
    or an id over 64 characters answered 500. Now nothing is looked up, nothing audited: 404."""
    app = world.app
    client = await developer(http_client, base_url, runtime, app.id, "dev@partner.example")
    for junk in ("%00", "grt%00x", "g" * 300, "%25%30%30", "..", "grt_unknown"):
        await client.get(f"/console/apps/{app.id}/grants")
        response = await client.post(f"/console/apps/{app.id}/grants/{junk}/revoke", {})
        assert response.code == 404, (junk[:10], response.code)
    revoked = AuditEvent.select().where(AuditEvent.action == "grants.revoked")
    assert [event.subject for event in revoked] == ["grt_unknown"]  # a well-formed id is looked up (none)


@pytest.mark.gen_test(timeout=60)
async def test_an_allowed_origin_with_a_path_is_refused_beside_its_field(http_client, base_url, runtime, world):
    """CORS matches origins only: the console once stored `https://app.example/home` and CORS then
    ignored it silently. The one manifest validation refuses it, here as in `apps create`."""
    app = world.app
    client = await developer(http_client, base_url, runtime, app.id, "dev@partner.example")
    await client.get(f"/console/apps/{app.id}")
    form = [("name", "Test App"), ("launch_url", "https://app.example.com/launch"),
            ("redirect_uri", "https://app.example.com/main"), ("token_endpoint", ""),
            ("allowed_origins", "https://app.example/home"), ("user_fields", "email")]
    bad = await client.post(f"/console/apps/{app.id}", form)
    assert bad.code == 400 and 'id="allowed_origins-error"' in client.last_html
    assert "scheme://host[:port] with no path" in client.last_html
    assert Application.get_by_id(app.id).allowed_origins == []
    form[4] = ("allowed_origins", "HTTPS://App.Example:443/")
    assert (await client.post(f"/console/apps/{app.id}", form)).code == 303
    assert Application.get_by_id(app.id).allowed_origins == ["https://app.example"]  # stored as CORS compares it
