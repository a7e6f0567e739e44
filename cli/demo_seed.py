"""Demo data: a sandbox clinic, a physician and a staff user, the example partner app and the
example SMART app (a public client, examples/smart_app) installed.

Seeding is idempotent: the same ids on every run against the same database. The demo client
secret is derived from the server's HMAC key, so it is stable per deployment but never a constant
in the source; after a rotation of that key, seeding again gives the app the secret the new key derives.
"""
from __future__ import annotations

from urllib.parse import urlsplit

import peewee

from connectors.sandbox import patient_panel
from fhir_api import fhir_base_url
from console.accounts import invite_developer
from lifecycle.applications import delete_application, install_application, register_application
from lifecycle.organizations import create_organization, update_organization
from lifecycle.users import create_user
from hub.sandbox import create_signin_link, issue_sandbox_token
from models.application import Application
from oauth.cors import normalize_origin
from oauth.secret_rotation import is_current_secret, rehash_secret
from models.directory import Organization, User
from models.ids import fhir_id


DEMO_ORG_ID = "org_demo_clinic"
DEMO_PHYSICIAN_ID = "usr_demo_physician"
DEMO_OTHER_ID = "usr_demo_staff"
DEMO_CLIENT_ID = "demo-partner-app"
DEMO_DEVELOPER_EMAIL = "developer@demo-partner.example"  # the example app's developer, in the console
DEMO_SMART_APP_ID = "demo-smart-app"
DEMO_SMART_CLIENT_ID = "demo-smart-app"
DEMO_SMART_APP_NAME = "Example SMART App"
# What the example SMART app asks for, and so declares: an EHR launch, who the user is, the patient.
DEMO_SMART_SCOPE = "launch openid fhirUser online_access patient/Patient.rs"
EXAMPLE_APP_PORT = 8889


def demo_patient():
    """The demo clinic's documented patient (docs/rest-api.md): the first of its sandbox EHR panel,
    pat-b15c092f2447b7a2, Lena Mercado. The sandbox derives its patients from the organization id,
    so she is the same on every run; a chart request for her builds a real archive."""
    return patient_panel(DEMO_ORG_ID)[0]


def demo_app_url(port: int = EXAMPLE_APP_PORT) -> str:
    return f"http://127.0.0.1:{port}"


def demo_settings(settings, port: int):
    """`serve --demo --port N` with the issuer left at its default serves, and names in tokens and
    links, http://127.0.0.1:N: the demo is where it says it is on any port."""
    from conf import Settings
    default = Settings().issuer
    if settings.issuer != default or port == urlsplit(default).port:
        return settings
    here = f"http://127.0.0.1:{port}"
    public_url = here if settings.public_url == default else settings.public_url
    return settings.replace(issuer=here, public_url=public_url)


def _app_base_url(app: Application) -> str:
    """The example app's base URL its registration was made for (its launch URL less /launch)."""
    return app.launch_url[: -len("/launch")] if app.launch_url.endswith("/launch") else app.launch_url


def smart_app_urls(app_base_url: str) -> dict:
    """The example SMART app's registration: served under /smart/ beside the example partner app."""
    base = app_base_url.rstrip("/") + "/smart"
    return {"launch_url": f"{base}/launch.html", "redirect_uri": f"{base}/index.html",
            "allowed_origin": normalize_origin(app_base_url)}


def _seed_smart_app(runtime, app_base_url: str) -> None:
    """Register (or move) the example SMART app as a public client and install it in the demo clinic."""
    urls = smart_app_urls(app_base_url)
    app = Application.get_or_none(Application.id == DEMO_SMART_APP_ID)
    if app is not None and (app.launch_url != urls["launch_url"] or app.allowed_origins != [urls["allowed_origin"]]):
        delete_application(runtime, DEMO_SMART_APP_ID, actor="demo")
        app = None
    if app is None:
        register_application(
            runtime, DEMO_SMART_APP_NAME, urls["redirect_uri"], urls["launch_url"], None, "paid", ["name"],
            [urls["allowed_origin"]], application_id=DEMO_SMART_APP_ID, client_id=DEMO_SMART_CLIENT_ID,
            redirect_uri_match="exact", public=True, smart_scopes=DEMO_SMART_SCOPE)
    install_application(DEMO_SMART_APP_ID, DEMO_ORG_ID)


def reset_demo(runtime) -> None:
    """Remove the demo clinic (its users, installations, launches, codes, tokens) and the demo
    apps, so the next seed is the first-launch state again."""
    with runtime.db.atomic():
        for app_id in (runtime.settings.demo_application_id, DEMO_SMART_APP_ID):
            if Application.get_or_none(Application.id == app_id) is not None:
                delete_application(runtime, app_id, actor="demo-reset")
        org = Organization.get_or_none(Organization.id == DEMO_ORG_ID)
        if org is not None:
            # recursive: users, installations and what hangs off them go with the clinic
            org.delete_instance(recursive=True)


def seed_demo(runtime, app_base_url: str | None = None, reset: bool = False) -> dict:
    """Create the demo data (idempotent). `app_base_url`: where the example app runs; given,
    the demo app is (re)registered for it, else an existing registration is kept. `reset`:
    start from the first-launch state (no activation status, nothing authorized)."""
    existing = Application.get_or_none(Application.id == runtime.settings.demo_application_id)
    if app_base_url is None and existing is not None:
        app_base_url = _app_base_url(existing)
    if reset:
        reset_demo(runtime)
    app_base_url = (app_base_url or demo_app_url()).rstrip("/")
    settings = runtime.settings
    # On SQLite take the write lock up front: a deferred transaction that reads first cannot upgrade
    # to a writer once the embedded worker has written meanwhile ("database is locked" at once,
    # busy_timeout does not help), and `serve --demo` seeds while its worker thread starts.
    immediate = {"lock_type": "IMMEDIATE"} if isinstance(runtime.db, peewee.SqliteDatabase) else {}
    with runtime.db.atomic(**immediate):
        ehr_url = f"{settings.public_url}/sandbox/ehr"
        org = Organization.get_or_none(Organization.id == DEMO_ORG_ID)
        if org is None:
            create_organization("Sandbox Family Clinic", "sandbox", ehr_url, org_id=DEMO_ORG_ID)
        elif org.ehr_url != ehr_url:
            update_organization(DEMO_ORG_ID, ehr_url=ehr_url, actor="demo")
        if User.get_or_none(User.id == DEMO_PHYSICIAN_ID) is None:
            create_user(DEMO_ORG_ID, "dr.ada.lovelace@sandbox.example", "Ada", "Lovelace", "alovelace",
                        "1234567893", user_id=DEMO_PHYSICIAN_ID)
        if User.get_or_none(User.id == DEMO_OTHER_ID) is None:
            create_user(DEMO_ORG_ID, "front.desk@sandbox.example", "Grace", "Hopper", "ghopper", None,
                        user_id=DEMO_OTHER_ID)
        secret = runtime.hasher.sign("demo-client-secret")
        app_id = settings.demo_application_id
        app = Application.get_or_none(Application.id == app_id)
        if app is not None and (_app_base_url(app) != app_base_url or app.allowed_origins != [normalize_origin(settings.public_url)]):
            # The demo moved (other ports): register it again where it now runs.
            delete_application(runtime, app_id, actor="demo")
            app = None
        if app is None:
            register_application(
                runtime, "Example Partner App", f"{app_base_url}/app", f"{app_base_url}/launch",
                f"{app_base_url}/api/token", "free_trial", ["email", "name", "ehrUsername", "organization"],
                [settings.public_url], application_id=app_id, client_id=DEMO_CLIENT_ID, client_secret=secret)
        elif not is_current_secret(app, secret, runtime.hasher):
            # SVC_HMAC_KEY was rotated: the secret derived from it changed, so the app gets the new one.
            rehash_secret(runtime, app, secret)
        install_application(app_id, DEMO_ORG_ID)
        _seed_smart_app(runtime, app_base_url)
    physician = User.get_by_id(DEMO_PHYSICIAN_ID)
    return {
        "organization_id": DEMO_ORG_ID,
        "physician_user_id": DEMO_PHYSICIAN_ID,
        "other_user_id": DEMO_OTHER_ID,
        "application_id": app_id,
        "client_id": DEMO_CLIENT_ID,
        "client_secret": secret,
        # A one-time sign-in link into the physician's hub (the hub itself needs a sandbox session).
        "hub_url": (create_signin_link(runtime, DEMO_PHYSICIAN_ID) if settings.sandbox
                    else f"{settings.public_url}/sandbox/hub"),
        "sandbox_token": issue_sandbox_token(runtime, physician),
    }


def example_app_config(runtime, info: dict, port: int = EXAMPLE_APP_PORT):
    """The example partner app's configuration for the demo: registered as the demo app, it lets
    the demo physician in and refuses everyone else (so the demo shows both outcomes)."""
    from examples.partner_app.config import PartnerConfig
    settings = runtime.settings
    return PartnerConfig(auth_url=settings.issuer, base_url=settings.public_url + "/v1",
                         client_id=info["client_id"], client_secret=info["client_secret"],
                         application_id=info["application_id"], public_url=demo_app_url(port),
                         authorized_users=frozenset({DEMO_PHYSICIAN_ID}))


def demo_fhir_user(settings, user_id: str) -> str:
    """The ID token's `fhirUser` for a demo user: `{iss}/Practitioner/{id}`, the user id in R4's
    spelling (`usr-demo-physician`; docs/smart.md)."""
    return f"{fhir_base_url(settings, DEMO_ORG_ID)}/Practitioner/{fhir_id(user_id)}"


def smart_app_config(runtime, port: int = EXAMPLE_APP_PORT):
    """The example SMART app's configuration for the demo: its client id and scope; it serves the
    demo physician and refuses everyone else (the demo shows both outcomes, as the partner app's)."""
    from examples.smart_app.web import SmartAppConfig
    settings = runtime.settings
    platform = tuple(dict.fromkeys(normalize_origin(url) for url in (settings.public_url, settings.issuer)))
    return SmartAppConfig(client_id=DEMO_SMART_CLIENT_ID, scope=DEMO_SMART_SCOPE,
                          authorized_users=(demo_fhir_user(settings, DEMO_PHYSICIAN_ID),), platform_origins=platform)


def demo_signin_links(runtime, info: dict) -> dict:
    """More one-time links for the demo banner (the hub link is `info["hub_url"]`): sign-in links,
    and a developer-console invitation for the example app's developer."""
    _, console_invite, _ = invite_developer(runtime, info["application_id"], DEMO_DEVELOPER_EMAIL, actor="demo")
    return {"physician_app": create_signin_link(runtime, DEMO_PHYSICIAN_ID, info["application_id"]),
            "staff_hub": create_signin_link(runtime, DEMO_OTHER_ID),
            "physician_settings": create_signin_link(runtime, DEMO_PHYSICIAN_ID, target="settings"),
            "physician_smart": create_signin_link(runtime, DEMO_PHYSICIAN_ID),
            "console_invite": console_invite}
