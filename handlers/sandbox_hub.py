"""The sandbox EHR: sign-in, the hub page that frames apps, its settings page, the hub's app list.

All of it answers 404 unless SVC_SANDBOX=on (hub.sandbox), and only sandbox users get in.
- `GET /sandbox/signin/<token>`: a one-time sign-in link (`svc-auth sandbox signin-link`); it opens
  a server-side session (HttpOnly, SameSite=Lax cookie; Secure under https) and lands on the hub
  (`?app=` with a deep link) or the settings page. Failed attempts are throttled per address.
- `GET /sandbox/signin`: the sign-in page; says how to get a link. `POST /sandbox/signout` ends the session.
- `GET /sandbox/hub[?app=<application id>]`: the signed-in user's hub; without a session, 302 to sign-in.
  A physician's hub lists their appointments of the next 7 days, one row per appointment
  (`<tr data-patient-id>`) with an `Open {app}` button per openable app: it launches the app with
  that patient in context (`patient_id` of `POST /v1/sandbox/launches`).
- `GET /sandbox/settings`: the signed-in user's 30-minute sandbox token.
- `GET /sandbox/api/apps` (Bearer sandbox token): the hub's app list as JSON, re-read after a
  launch completes and every `HUB_REFRESH_SECONDS`.
The hub's browser code (static/hub/hub.js) creates launches with `POST /v1/sandbox/launches` and
has the SDK's access token verified with `POST /v1/oauth/introspect` using the sandbox token as
Bearer: that check is the platform verification (handlers.oauth.IntrospectionHandler).
"""
from __future__ import annotations

import datetime as dt
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import tornado.template

from handlers.base import BaseHandler
from hub.view import frame_origins, hub_entries_for_token, hub_view
from hub.sandbox import (SESSION_COOKIE, end_sandbox_session, open_app_mark, open_sandbox_session_from_link,
                         opens_at_once, require_sandbox_on, sandbox_session_of, signed_in_at)
from errors import ApiError
from oauth.cors import normalize_origin
from ops.jsontext import script_json

TEMPLATES = tornado.template.Loader(str(Path(__file__).resolve().parent / "templates"))

# Capabilities the framed app gets: its own origin (needed for its fetches and for postMessage
# origins), scripts, forms, popups, and its own dialogs (alert/confirm/prompt: apps as shipped report
# with them). No top navigation, no downloads (docs/hub-and-sdk.md lists each flag and why).
IFRAME_SANDBOX = "allow-scripts allow-same-origin allow-forms allow-popups allow-modals"

# The hub re-reads its app list this often, so an activation change shows without a reload.
HUB_REFRESH_SECONDS = 3

SIGNIN_PATH = "/sandbox/signin"
PAGE_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            "frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'")


def service_origin(settings) -> str:
    """SVC_PUBLIC_URL's origin as a browser writes it (its `Origin` header, a CSP source): scheme and
    host in lower case, no default port, however the setting spells them."""
    parts = urlsplit(settings.public_url)
    return normalize_origin(f"{parts.scheme}://{parts.netloc}") or f"{parts.scheme}://{parts.netloc}"


def same_origin_referrer(handler: BaseHandler) -> None:
    """`Referrer-Policy: same-origin` for a page whose form posts to `posted_from_own_page`: the
    browser then sends its origin (and the page's address) to this service only, never elsewhere."""
    handler.set_header("Referrer-Policy", "same-origin")


def posted_from_own_page(handler: BaseHandler) -> bool:
    """Whether a POST came from one of the service's own pages, not a form on another site.
    `Sec-Fetch-Site` (sent by browsers to https and loopback origins) says so directly; without it
    (plain http to a host name), `Origin` must be absent (not a browser) or the service's origin.
    A form on a `Referrer-Policy: no-referrer` page posts `Origin: null`, which proves nothing:
    pages with such forms send `same_origin_referrer`."""
    fetch_site = handler.request.headers.get("Sec-Fetch-Site")
    if fetch_site is not None:
        return fetch_site == "same-origin"
    origin = handler.request.headers.get("Origin")
    return origin is None or origin == service_origin(handler.svc_settings)


class SandboxHandler(BaseHandler):
    """Every sandbox route: 404 while the sandbox is off."""

    async def prepare(self):
        super().prepare()
        require_sandbox_on(self.svc_settings)


def set_session_cookie(handler: BaseHandler, session_id: str) -> None:
    """The sandbox session cookie (sign-in link, invitation link): HttpOnly, SameSite=Lax, Secure under https."""
    secure = handler.svc_settings.public_url.startswith("https://") or handler.request.protocol == "https"
    handler.set_cookie(SESSION_COOKIE, session_id, path="/sandbox", httponly=True, samesite="Lax",
                       secure=secure, expires_days=None, max_age=handler.svc_settings.sandbox_session_ttl)


class SandboxPageHandler(SandboxHandler):
    async def signed_in(self):
        """(user, session) of this browser's sandbox session, or None after redirecting to sign-in."""
        found = await self.run(sandbox_session_of, self.runtime, self.get_cookie(SESSION_COOKIE))
        if found is None:
            self.no_store()
            self.redirect(SIGNIN_PATH)
        return found

    async def signed_in_view(self, appointments: bool = False):
        """The signed-in user's hub view (user, entries, sandbox token, organization; with
        `appointments`, their upcoming appointments), or None after redirecting to sign-in."""
        found = await self.signed_in()
        if found is None:
            return None
        user, session = found
        return await self.run(hub_view, self.runtime, user.id, signed_in_at(session), appointments)

    def render_page(self, name: str, csp: str, **values) -> None:
        self.no_store()
        # Top-level pages only (never framed): nothing of the hub's origin but the (script-free)
        # authorize redirect ever loads inside the app frame, so `allow-same-origin` there cannot reach the hub.
        self.html_headers(csp)
        same_origin_referrer(self)  # the Sign out form (hub, settings)
        self.finish(TEMPLATES.load(name).generate(static_url=self.static_url, **values))


class SignInPageHandler(SandboxPageHandler):
    """Where a browser without a session lands: how to get a sign-in link."""

    async def get(self):  # a template, no I/O
        self.render_page("signin.html", PAGE_CSP, error=None)


class SignInLinkHandler(SandboxPageHandler):
    """A one-time sign-in link: opens the session, then the hub (or the app, or settings)."""

    async def get(self, token):
        try:
            session_id, user, link = await self.run(open_sandbox_session_from_link, self.runtime, token, self.client_address())
        except ApiError as err:
            self.set_status(err.status)
            for name, value in err.headers.items():
                self.set_header(name, value)
            return self.render_page("signin.html", PAGE_CSP, error=err.message)
        set_session_cookie(self, session_id)
        self.no_store()
        if link.target == "settings":
            return self.redirect("/sandbox/settings")
        if not link.application_id:
            return self.redirect("/sandbox/hub")
        mark = open_app_mark(self.runtime, session_id, link.application_id)
        self.redirect("/sandbox/hub?" + urlencode({"app": link.application_id, "open": mark}))


class SignOutHandler(SandboxPageHandler):
    async def post(self):
        if not posted_from_own_page(self):
            # A form on another site: its POST carries no Lax cookie, but the answer's clearing
            # Set-Cookie would still sign the user out.
            self.set_status(403)
            return self.render_page("signin.html", PAGE_CSP, error="Sign out from the hub's own page.")
        await self.run(end_sandbox_session, self.runtime, self.get_cookie(SESSION_COOKIE))
        self.clear_cookie(SESSION_COOKIE, path="/sandbox")
        self.no_store()
        self.redirect(SIGNIN_PATH)


class HubHandler(SandboxPageHandler):
    async def get(self):
        view = await self.signed_in_view(appointments=True)
        if view is None:
            return
        user, entries, token, organization = view.user, view.entries, view.sandbox_token, view.organization
        own = service_origin(self.svc_settings)
        frames = " ".join(dict.fromkeys(["'self'", own, *frame_origins(entries)]))
        csp = (f"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
               f"connect-src 'self' {own}; frame-src {frames}; frame-ancestors 'none'; base-uri 'none'; "
               f"form-action 'self'; object-src 'none'")
        data = {"user": {"id": user.id, "name": user.display_name},
                "organizationId": user.organization_id, "sandboxToken": token,
                "apiBase": self.svc_settings.public_url + "/v1", "appsUrl": "/sandbox/api/apps",
                "openApp": self._app_to_open(), "apps": [e.as_dict() for e in entries],
                "refreshSeconds": HUB_REFRESH_SECONDS}
        self.render_page("hub.html", csp, user=user, organization=organization, entries=entries,
                         appointments=view.appointments, appointments_error=view.appointments_error,
                         sandbox=IFRAME_SANDBOX, data_json=script_json(data))

    def _app_to_open(self) -> str | None:
        """`?app=`, when the sign-in link's redirect marked it for this session (`open_app_mark`)."""
        params = self.query_params()
        app = params.get("app")
        return app if opens_at_once(self.runtime, self.get_cookie(SESSION_COOKIE), app, params.get("open")) else None


class SettingsHandler(SandboxPageHandler):
    async def get(self):
        view = await self.signed_in_view()
        if view is None:
            return
        user, apps, token, organization = view.user, view.entries, view.sandbox_token, view.organization
        ttl = self.svc_settings.sandbox_token_ttl
        expires = (self.runtime.clock.now() + dt.timedelta(seconds=ttl)).replace(microsecond=0).isoformat() + "Z"
        self.render_page("settings.html", PAGE_CSP, user=user, organization=organization, token=token,
                         ttl_minutes=ttl // 60, expires_at=expires, apps=apps,
                         launches_url=self.svc_settings.public_url + "/v1/sandbox/launches")


class HubAppsHandler(SandboxHandler):
    """The hub's app list for the bearer of a sandbox token."""

    async def get(self):
        entries = await self.run(hub_entries_for_token, self.runtime, self.request.headers.get("Authorization"))
        self.no_store()
        self.write_json({"apps": [e.as_dict() for e in entries]})


def routes(runtime) -> list:
    return [
        (r"/sandbox/hub", HubHandler),
        (r"/sandbox/settings", SettingsHandler),
        (r"/sandbox/api/apps", HubAppsHandler),
        (r"/sandbox/signin", SignInPageHandler),
        (r"/sandbox/signin/([^/]+)", SignInLinkHandler),
        (r"/sandbox/signout", SignOutHandler),
    ]
