"""The developer console in tests: a small browser-like client over pytest-tornado's HTTP client
(keeps cookies, reads the CSRF token from the last page, submits forms), a page's CSRF token, and
a developer invited, with a password, signed in."""
from __future__ import annotations

import re
import urllib.parse
from http.cookies import SimpleCookie

XSRF = re.compile(r'name="_xsrf" value="([^"]+)"')
PASSWORD = "correct horse battery staple"


def form_xsrf(html: str) -> str:
    """The `_xsrf` field of the last form on a page (the console's CSRF token)."""
    return XSRF.findall(html)[-1]


class ConsoleClient:
    def __init__(self, http_client, base_url, address: str | None = None):
        self.http, self.base_url = http_client, base_url
        self.cookies: dict[str, str] = {}
        # Cookies another host set for a parent domain (a sibling host's): the browser sends them
        # too, after its own of the same path when they were set later; the server never replaces them.
        self.planted: list[tuple[str, str]] = []
        self.last_html = ""
        self.address = address  # sent as X-Forwarded-For (only read behind a trusted proxy)

    def _headers(self, extra=None) -> dict:
        headers = dict(extra or {})
        if self.cookies or self.planted:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in [*self.cookies.items(), *self.planted])
        if self.address:
            headers["X-Forwarded-For"] = self.address
        return headers

    def _keep_cookies(self, response) -> None:
        for header in response.headers.get_list("Set-Cookie"):
            cookie = SimpleCookie()
            cookie.load(header)
            for name, morsel in cookie.items():
                if morsel["expires"] and "1970" in morsel["expires"] or morsel.value == "":
                    self.cookies.pop(name, None)
                else:
                    self.cookies[name] = morsel.value

    async def get(self, path: str):
        response = await self.http.fetch(self.base_url + path, headers=self._headers(), raise_error=False,
                                         follow_redirects=False)
        self._keep_cookies(response)
        self.last_html = response.body.decode("utf-8", "replace")
        return response

    def xsrf(self) -> str:
        match = XSRF.search(self.last_html)
        assert match, "no CSRF token on the last page"
        return match.group(1)

    async def post(self, path: str, fields=(), xsrf: bool = True):
        """POST a form; `fields` is a dict or a list of pairs (repeat a name for checkboxes)."""
        pairs = list(fields.items()) if isinstance(fields, dict) else list(fields)
        if xsrf:
            pairs.append(("_xsrf", self.xsrf()))
        response = await self.http.fetch(
            self.base_url + path, method="POST", body=urllib.parse.urlencode(pairs), raise_error=False,
            follow_redirects=False,
            headers=self._headers({"Content-Type": "application/x-www-form-urlencoded"}))
        self._keep_cookies(response)
        self.last_html = response.body.decode("utf-8", "replace")
        return response

    async def sign_in(self, email: str, password: str, code: str = ""):
        await self.get("/console/login")
        return await self.post("/console/login", {"email": email, "password": password, "totp_code": code})

    async def keep_busy(self, runtime, seconds: float) -> None:
        """Use the session, as a developer at work would, while the runtime's clock moves `seconds`
        on (never idle as long as SVC_CONSOLE_IDLE_TIMEOUT)."""
        step = runtime.settings.console_idle_timeout - 60
        while seconds > 0:
            runtime.clock.advance(min(step, seconds))
            seconds -= step
            assert (await self.get("/console")).code == 200, self.last_html


def invite_path(runtime, app_id, email) -> str:
    """The path of a new invitation link of `email` to `app_id`."""
    from console.accounts import invite_developer
    _, url, _ = invite_developer(runtime, app_id, email)
    return urllib.parse.urlsplit(url).path


async def developer(http_client, base_url, runtime, app_id, email, password=PASSWORD,
                    address: str | None = None) -> ConsoleClient:
    """A developer invited to `app_id`, password set, signed in (from `address`, through a
    trusted proxy, when given)."""
    client = ConsoleClient(http_client, base_url, address)
    path = invite_path(runtime, app_id, email)
    assert (await client.get(path)).code == 200
    response = await client.post(path, {"password": password, "confirm": password})
    assert response.code == 303, client.last_html
    assert (await client.sign_in(email, password)).code == 303, client.last_html
    return client
