"""`ConsoleHandler`: HTML pages, the session cookie, the CSRF check and the developer's access."""
from __future__ import annotations

from pathlib import Path

import tornado.web

from handlers.base import BaseHandler
from console.accounts import developer_application, session_csrf_token, session_csrf_valid, session_developer
from errors import ApiError

TEMPLATE_DIR = str(Path(__file__).resolve().parent / "templates")
SESSION_COOKIE = "svc_console"
DEVICE_COOKIE = "svc_console_device"  # console.devices: makes the browser a trusted device at sign-in
CSP = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; "
       "base-uri 'none'")


class ConsoleHandler(BaseHandler):
    """A console page. `signed_in_only` pages send visitors without a session to the sign-in page."""

    signed_in_only = True
    developer = None
    session_token = None  # the `svc_console` cookie's value while its session is live

    def get_template_path(self):
        return TEMPLATE_DIR

    def set_default_headers(self):
        super().set_default_headers()
        self.no_store()
        self.set_header("Content-Security-Policy", CSP)
        self.set_header("X-Frame-Options", "DENY")

    async def prepare(self):
        super().prepare()
        token = self.get_cookie(SESSION_COOKIE)
        self.developer = await self.run(session_developer, self.runtime, token)
        self.session_token = token if self.developer is not None else None
        if self.developer is None and self.signed_in_only:
            # Nothing changes without a session: a form posted after it ended leads to the sign-in.
            if token:
                self.clear_cookie(SESSION_COOKIE, path="/console")
            return self.redirect("/console/login", status=303 if self.request.method == "POST" else 302)
        if self.request.method not in ("GET", "HEAD", "OPTIONS"):
            # xsrf_cookies stays off for the application (OAuth/REST clients post without it);
            # every console form must carry the token: 403 without it.
            self.check_xsrf_cookie()

    @property
    def xsrf_token(self) -> bytes:
        """The forms' CSRF token (`xsrf_form_html` puts it in each form): with a live session, the
        session's own (`session_csrf_token`), no cookie involved; without one (sign-in, invitation),
        Tornado's double-submit token, which sets the `_xsrf` cookie."""
        if self.session_token:
            return session_csrf_token(self.runtime, self.session_token).encode("ascii")
        return super().xsrf_token

    def check_xsrf_cookie(self) -> None:
        """403 unless the request carries the right CSRF token (form field `_xsrf`, or the
        X-XSRFToken / X-CSRFToken header, as Tornado reads it): with a live session, only that
        session's token, so a planted `_xsrf` cookie and a form token to match it are refused;
        without one, Tornado's check of the token against the `_xsrf` cookie."""
        if not self.session_token:
            return super().check_xsrf_cookie()
        presented = (self.get_argument("_xsrf", None) or self.request.headers.get("X-Xsrftoken")
                     or self.request.headers.get("X-Csrftoken"))
        if not session_csrf_valid(self.runtime, self.session_token, presented):
            raise tornado.web.HTTPError(403, "'_xsrf' argument is not this session's CSRF token")

    @property
    def secure(self) -> bool:
        return self.request.protocol == "https" or self.svc_settings.issuer.startswith("https:")

    def set_session_cookie(self, token: str) -> None:
        self.set_cookie(SESSION_COOKIE, token, path="/console", httponly=True, samesite="Lax", secure=self.secure)

    def cookie_values(self, name: str) -> tuple[str, ...]:
        """Every value of the cookie `name` the request carries, in order. `get_cookie` gives the
        last one only, and a host under the same parent domain can set a cookie of that name for
        the domain, which the browser sends beside (after) the console's own."""
        return tuple(value.strip() for header in self.request.headers.get_list("Cookie")
                     for key, sep, value in (chunk.partition("=") for chunk in header.split(";"))
                     if sep and key.strip() == name)

    def set_device_cookie(self, value: str) -> None:
        """The device cookie a sign-in gives the browser: the session cookie's attributes, and kept
        for SVC_CONSOLE_DEVICE_COOKIE_LIFETIME (signing out keeps it: it is no session)."""
        self.set_cookie(DEVICE_COOKIE, value, path="/console", httponly=True, samesite="Lax", secure=self.secure,
                        max_age=self.svc_settings.console_device_cookie_lifetime)

    def rotate_csrf_token(self) -> None:
        """Drop the double-submit CSRF cookie at sign-in and sign-out: signed-in pages use the
        session's token instead, and the next page without a session makes a new one."""
        # With the attributes it was set with (server.py), or a browser keeps a Secure/SameSite one.
        self.clear_cookie(self.settings.get("xsrf_cookie_name", "_xsrf"),
                          **self.settings.get("xsrf_cookie_kwargs", {}))

    async def own_application(self, application_id: str):
        """The signed-in developer's application, checked on every request; anything else 404."""
        return await self.run(developer_application, self.developer, application_id)

    def form(self, name: str) -> str:
        """A form field (the last value). Tornado replaces control characters, NUL included,
        with spaces in form arguments, so none reaches the database."""
        return self.get_body_argument(name, "", strip=False)

    def form_list(self, name: str) -> list[str]:
        return self.get_body_arguments(name, strip=False)

    def page(self, template: str, status: int = 200, **values) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "text/html; charset=UTF-8")
        values.setdefault("app", None)
        values.setdefault("section", None)
        self.render(template, developer=self.developer, **values)

    def write_error(self, status_code: int, **kwargs):
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, ApiError):
            message = exc.message
            for name, value in exc.headers.items():
                self.set_header(name, value)
        elif isinstance(exc, tornado.web.HTTPError) and status_code == 403:
            message = "The form expired or did not come from this console (missing or wrong CSRF token). Reload and retry."
        elif isinstance(exc, tornado.web.HTTPError) and status_code < 500:
            message = {404: "No such page."}.get(status_code, exc.log_message or self._reason)
        else:
            message = "The server could not complete the request."
        self.set_header("Content-Type", "text/html; charset=UTF-8")
        self.render("error.html", developer=self.developer, app=None, section=None, status=status_code,
                    message=message)
