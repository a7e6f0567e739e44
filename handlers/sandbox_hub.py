"""The sandbox EHR: the hub page that frames apps, its settings page, and the hub's app list.

- `GET /sandbox/hub?user=<id>[&app=<application id>]`: the hub of a sandbox user.
- `GET /sandbox/settings?user=<id>`: shows the user's 30-minute sandbox token.
- `GET /sandbox/api/apps` (Bearer sandbox token): the hub's app list as JSON, re-read after a
  launch completes and every `HUB_REFRESH_SECONDS`.
The hub's browser code (static/hub/hub.js) creates launches with `POST /v1/sandbox/launches` and
has the SDK's access token verified with `POST /v1/oauth/introspect` using the sandbox token as
Bearer: that check is the platform verification (handlers.oauth.IntrospectionHandler).
"""
from __future__ import annotations

import datetime as dt
from pathlib import Path

import tornado.escape
import tornado.template

from handlers.base import BaseHandler
from lifecycle.hub import frame_origins, hub_entries_for_token, hub_view, origin_of
from oauth.errors import ApiError
from oauth.resource import bearer_value

TEMPLATES = tornado.template.Loader(str(Path(__file__).resolve().parent / "templates"))

# Capabilities the framed app gets: its own origin (needed for its fetches and for postMessage
# origins), scripts, forms, popups. No top navigation, no downloads, no modals of the hub's.
IFRAME_SANDBOX = "allow-scripts allow-same-origin allow-forms allow-popups"

# The hub re-reads its app list this often, so an activation change shows without a reload.
HUB_REFRESH_SECONDS = 3


class SandboxPageHandler(BaseHandler):
    async def page_view(self):
        user_id = self.query_params().get("user")
        if not user_id:
            raise ApiError(400, "invalid_request", "The user parameter is required (?user=<user id>).")
        return await self.run(hub_view, self.runtime, user_id)

    def render_page(self, name: str, csp: str, **values) -> None:
        self.set_header("Content-Type", "text/html; charset=UTF-8")
        self.set_header("Cache-Control", "no-store")
        self.set_header("Content-Security-Policy", csp)
        # Top-level pages only: nothing of the hub's origin but the (script-free) authorize redirect
        # ever loads inside the app frame, so `allow-same-origin` there cannot reach the hub.
        self.set_header("X-Frame-Options", "DENY")
        self.finish(TEMPLATES.load(name).generate(static_url=self.static_url, **values))


class HubHandler(SandboxPageHandler):
    async def get(self):
        view = await self.page_view()
        user, entries = view.user, view.entries
        own = origin_of(self.svc_settings.public_url)
        frames = " ".join(dict.fromkeys(["'self'", own, *frame_origins(entries)]))
        csp = (f"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
               f"connect-src 'self' {own}; frame-src {frames}; frame-ancestors 'none'; base-uri 'none'; "
               f"form-action 'self'; object-src 'none'")
        data = {"user": {"id": user.id, "name": user.display_name},
                "organizationId": user.organization_id, "sandboxToken": view.sandbox_token,
                "apiBase": self.svc_settings.public_url + "/v1", "appsUrl": "/sandbox/api/apps",
                "openApp": self.query_params().get("app"), "apps": [e.as_dict() for e in entries],
                "refreshSeconds": HUB_REFRESH_SECONDS}
        self.render_page("hub.html", csp, user=user, organization=view.organization, entries=entries,
                         sandbox=IFRAME_SANDBOX, data_json=tornado.escape.json_encode(data))


class SettingsHandler(SandboxPageHandler):
    async def get(self):
        view = await self.page_view()
        ttl = self.svc_settings.sandbox_token_ttl
        expires = (self.runtime.clock.now() + dt.timedelta(seconds=ttl)).replace(microsecond=0).isoformat() + "Z"
        csp = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
               "frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'")
        self.render_page("settings.html", csp, user=view.user, organization=view.organization,
                         token=view.sandbox_token, ttl_minutes=ttl // 60, expires_at=expires, apps=view.entries,
                         launches_url=self.svc_settings.public_url + "/v1/sandbox/launches")


class HubAppsHandler(BaseHandler):
    """The hub's app list for the bearer of a sandbox token."""

    async def get(self):
        token = bearer_value(self.request.headers.get("Authorization"))
        entries = await self.run(hub_entries_for_token, self.runtime, token)
        self.set_header("Cache-Control", "no-store")
        self.write_json({"apps": [e.as_dict() for e in entries]})


def routes(runtime) -> list:
    return [
        (r"/sandbox/hub", HubHandler),
        (r"/sandbox/settings", SettingsHandler),
        (r"/sandbox/api/apps", HubAppsHandler),
    ]
