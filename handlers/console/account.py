"""Sign-in, sign-out, the invitation page (set a password, optional TOTP) and the app list."""
from __future__ import annotations

from handlers.console.base import DEVICE_COOKIE, SESSION_COOKIE, ConsoleHandler
from console.accounts import FieldErrors, accept_invite, applications_of, end_console_session, invite_totp_secret, \
    open_invite, sign_in, totp_uri
from errors import ApiError
from ratelimit import RateLimiterUnavailable


class HomeHandler(ConsoleHandler):
    async def get(self):
        apps = await self.run(applications_of, self.developer)
        self.page("home.html", apps=apps)


class LoginHandler(ConsoleHandler):
    signed_in_only = False

    async def get(self):
        if self.developer is not None:
            return self.redirect("/console")
        self.page("login.html", email="", error=None, notice=self.get_query_argument("notice", ""))

    async def post(self):
        email = self.form("email")
        try:
            signed_in = await self.run(sign_in, self.runtime, email, self.form("password"),
                                       self.form("totp_code"), self.client_address(), self.cookie_values(DEVICE_COOKIE))
        except RateLimiterUnavailable:
            self.set_header("Retry-After", "5")
            return self.page("login.html", 503, email=email, notice="",
                             error="Sign-in is unavailable for a moment (the shared store cannot be reached). Retry.")
        except ApiError as exc:
            for name, value in exc.headers.items():
                self.set_header(name, value)
            return self.page("login.html", exc.status, email=email, error=exc.message, notice="")
        self.set_session_cookie(signed_in.session)
        self.set_device_cookie(signed_in.device)
        self.rotate_csrf_token()
        self.redirect("/console", status=303)


class LogoutHandler(ConsoleHandler):
    """Ends the session; its CSRF token, bound to it, ends with it. Without a live session there is
    nothing to end: the visitor goes to the sign-in page (ConsoleHandler.prepare). The device
    cookie stays: it signs nobody in, and keeps the browser trusted at its next sign-in."""

    async def post(self):
        await self.run(end_console_session, self.runtime, self.get_cookie(SESSION_COOKIE))
        self.clear_cookie(SESSION_COOKIE, path="/console")
        self.rotate_csrf_token()
        self.redirect("/console/login?notice=signed-out", status=303)


class InviteHandler(ConsoleHandler):
    signed_in_only = False

    async def get(self, token):
        invite = await self.run(open_invite, self.runtime, token)
        if invite.developer.password_hash:
            return self.page("invite_existing.html", email=invite.developer.email)
        secret = invite_totp_secret(self.runtime, invite)
        self.page("invite.html", email=invite.developer.email, totp_secret=secret,
                  totp_uri=totp_uri(secret, invite.developer.email), errors={})

    async def post(self, token):
        try:
            await self.run(accept_invite, self.runtime, token, self.form("password"), self.form("confirm"),
                           self.form("totp_code"))
        except FieldErrors as exc:
            invite = await self.run(open_invite, self.runtime, token)
            secret = invite_totp_secret(self.runtime, invite)
            return self.page("invite.html", 400, email=invite.developer.email, totp_secret=secret,
                             totp_uri=totp_uri(secret, invite.developer.email), errors=exc.fields)
        self.redirect("/console/login?notice=password-set", status=303)


def routes() -> list:
    return [
        (r"/console/?", HomeHandler),
        (r"/console/login", LoginHandler),
        (r"/console/logout", LogoutHandler),
        (r"/console/invite/([A-Za-z0-9_-]{1,100})", InviteHandler),
    ]
