"""HTTP endpoints of the example partner app and `make_partner_app(config)`."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from urllib.parse import quote, unquote_plus, urlencode

import tornado.log
import tornado.web

from examples.partner_app.authorizations import PendingAuthorizations
from examples.partner_app.config import PartnerConfig, origin_of
from examples.partner_app.cors import origin_allowed
from examples.partner_app.id_tokens import IdTokenVerifier, InvalidIdToken, JwksCache
from examples.partner_app.platform_client import PlatformClient
from examples.partner_app.records import Refused, UserRecords
from examples.partner_app.sessions import SessionStore

HERE = Path(__file__).resolve().parent


class PartnerError(Exception):
    """An error answer `{"error", "message"}` with an HTTP status."""

    def __init__(self, status: int, error: str, message: str):
        super().__init__(message)
        self.status, self.error, self.message = status, error, message


class PartnerHandler(tornado.web.RequestHandler):
    """Base: JSON errors, and CORS for origins under the service's domain."""

    cors_methods = "GET, POST, OPTIONS"

    @property
    def partner(self) -> "PartnerApp":
        return self.application.settings["partner"]

    def set_default_headers(self):
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Referrer-Policy", "no-referrer")
        self.set_header("Vary", "Origin")

    def prepare(self):
        origin = self.request.headers.get("Origin")
        if origin is None:
            return  # not a CORS request (a navigation or a server-to-server call)
        if not origin_allowed(origin, self.partner.config.allowed_origins, origin_of(self.partner.config.public_url)):
            raise PartnerError(403, "origin_not_allowed", f"Requests from {origin} are not accepted.")
        self.set_header("Access-Control-Allow-Origin", origin)
        self.set_header("Access-Control-Allow-Credentials", "true")

    def options(self, *args):
        """Preflight: `prepare` already refused other origins."""
        self.set_header("Access-Control-Allow-Methods", self.cors_methods)
        self.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type")
        self.set_header("Access-Control-Max-Age", "600")
        self.set_status(204)
        self.finish()

    def json_body(self) -> dict:
        try:
            value = json.loads(self.request.body or b"{}")
        except ValueError:
            raise PartnerError(400, "invalid_request", "The body must be a JSON object.") from None
        if not isinstance(value, dict):
            raise PartnerError(400, "invalid_request", "The body must be a JSON object.")
        return value

    def bearer(self) -> str | None:
        scheme, _, value = (self.request.headers.get("Authorization") or "").partition(" ")
        return value.strip() or None if scheme.lower() == "bearer" else None

    def write_json(self, value, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(value))

    def send_error(self, status_code: int = 500, **kwargs):
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, PartnerError):
            status_code = exc.status
        super().send_error(status_code, **kwargs)

    def write_error(self, status_code: int, **kwargs):
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, PartnerError):
            body = {"error": exc.error, "message": exc.message}
        elif status_code < 500:
            body = {"error": "bad_request", "message": self._reason}
        else:
            body = {"error": "server_error", "message": "The example app could not complete the request."}
        self.write_json(body, status_code)

    def log_exception(self, typ, value, tb):
        if not isinstance(value, PartnerError):
            super().log_exception(typ, value, tb)


class LaunchHandler(PartnerHandler):
    """The launch endpoint: check the EHR, redirect to the authorize endpoint."""

    def get(self):
        config = self.partner.config
        launch_id = self.get_query_argument("launch_id", "")
        org_id = self.get_query_argument("svc_organization_id", "")
        ehr_url = self.get_query_argument("ehr_url", "")
        if not launch_id:
            raise PartnerError(400, "invalid_request", "launch_id is required.")
        if not ehr_accepted(ehr_url, config.ehr_allow, config.ehr_deny):
            raise PartnerError(403, "ehr_not_allowed", "This app does not run in that EHR.")
        redirect_uri = config.redirect_base
        if config.multi_tenant and org_id:
            redirect_uri += "/" + quote(org_id, safe="")
        # state (CSRF), nonce (ID token replay) and PKCE S256 (code injection): RFC 9700 2.1.
        query = urlencode({"launch_id": launch_id, "client_id": config.client_id,
                           "redirect_uri": redirect_uri, "response_type": "code",
                           **self.partner.authorizations.start()})
        # Demonstrates the SDK's identity-provider variant (app.js reads this cookie): the page
        # exchanges the code through the app's backend itself and gives the SDK the access token.
        if self.get_query_argument("variant", "") == "identity-provider":
            self.set_cookie("sdk_variant", "identity-provider", path="/app", samesite="Lax")
        else:
            self.clear_cookie("sdk_variant", path="/app")
        self.set_header("Cache-Control", "no-store")
        self.redirect(f"{config.base_url}/oauth/authorize?{query}")


def ehr_accepted(ehr_url: str, allow: tuple, deny: tuple) -> bool:
    """Allow/deny lists of EHR address prefixes; deny wins; an empty allow list allows all."""
    if any(ehr_url.startswith(prefix) for prefix in deny):
        return False
    return not allow or any(ehr_url.startswith(prefix) for prefix in allow)


class AppTokenHandler(PartnerHandler):
    """The app token endpoint: code -> token response, 403, or 403 trial_expired."""

    cors_methods = "POST, OPTIONS"

    async def post(self):
        code = self.json_body().get("code")
        if not isinstance(code, str) or not code:
            raise PartnerError(400, "invalid_request", "code is required.")
        partner = self.partner
        pending = partner.authorizations.take(code)
        if pending is None:
            raise PartnerError(400, "invalid_grant", "This code did not come back from an authorization request "
                                                     "this app started (unknown or reused state).")
        verifier, nonce = pending
        answer = await partner.platform.exchange_code(code, verifier)
        if answer.status == 401 or answer.status >= 500:
            raise PartnerError(502, "token_exchange_failed", f"The service refused the exchange: {answer.describe()}")
        if not answer.ok:
            raise PartnerError(400, (answer.body or {}).get("error", "invalid_grant"),
                               f"The code could not be exchanged: {answer.describe()}")
        try:
            claims = await partner.verifier.verify(answer.body.get("id_token", ""))
        except InvalidIdToken as exc:
            raise PartnerError(502, "invalid_id_token", f"The ID token failed verification: {exc}") from None
        if claims.get("nonce") != nonce:
            raise PartnerError(502, "invalid_id_token", "The ID token's nonce is not the one this app sent.")
        info = await partner.platform.userinfo(answer.body["access_token"])
        organization = organization_claim(info.body if info.ok else None)
        try:
            partner.records.admit(claims, organization and organization.get("id"))
        except Refused as refused:
            raise PartnerError(403, refused.error, refused.message) from None
        self.write_json(answer.body)


def organization_claim(userinfo: dict | None) -> dict | None:
    """The `https://{claims_namespace}/organization` claim, whatever the namespace."""
    for name, value in (userinfo or {}).items():
        if name.startswith("https://") and name.endswith("/organization") and isinstance(value, dict):
            return value
    return None


class SessionHandler(PartnerHandler):
    """SSO: exchange the ID token (Bearer) for the app's own session token."""

    cors_methods = "POST, OPTIONS"

    async def post(self):
        partner = self.partner
        try:
            claims = await partner.verifier.verify(self.bearer() or "")
        except InvalidIdToken as exc:
            raise PartnerError(401, "invalid_token", f"The ID token is not valid: {exc}") from None
        try:
            partner.records.admit(claims, partner.records.organization_of.get(claims["sub"]))
        except Refused as refused:
            raise PartnerError(403, refused.error, refused.message) from None
        token, session = partner.sessions.open(claims)
        self.write_json({"session_token": token, "token_type": "Bearer",
                         "expires_in": partner.sessions.ttl, "user": session})


class SessionUserMixin:
    def session_user(self) -> dict:
        session = self.partner.sessions.get(self.bearer())
        if session is None:
            raise PartnerError(401, "invalid_session", "Sign in first (POST /api/session).")
        return session


class MeHandler(SessionUserMixin, PartnerHandler):
    def get(self):
        self.write_json(self.session_user())


class ActivationHandler(SessionUserMixin, PartnerHandler):
    """"Enable for this clinic": the backend calls the REST API's activation operation."""

    cors_methods = "POST, OPTIONS"

    async def post(self):
        session = self.session_user()
        partner = self.partner
        organization_id = partner.records.organization_of.get(session["sub"])
        if not organization_id or not partner.config.application_id:
            raise PartnerError(409, "activation_unavailable",
                               "The app does not know this user's clinic or its own application id.")
        answer = await partner.platform.set_activation_status(organization_id, "Enabled")
        if not answer.ok:
            raise PartnerError(502, "activation_failed", f"The service answered {answer.describe()}")
        self.write_json({"organization_id": organization_id, **answer.body})


class MainPageHandler(PartnerHandler):
    """The redirect_uri: the page that initializes the SDK."""

    def get(self, organization_id=None):
        config = self.partner.config
        code = self.get_query_argument("code", None)
        if code is not None:
            # Tie the code to the authorization request its state names; otherwise it is never exchanged.
            self.partner.authorizations.redeem(self.get_query_argument("state", None), code)
        frame_ancestors = " ".join(config.platform_origins)
        self.set_header("Content-Security-Policy",
                        f"default-src 'self'; script-src 'self' {origin_of(config.sdk_url)}; connect-src 'self'; "
                        f"style-src 'self'; img-src 'self' data:; base-uri 'none'; object-src 'none'; "
                        f"form-action 'self'; frame-ancestors {frame_ancestors}")
        self.set_header("Cache-Control", "no-store")
        self.render("main.html", sdk_url=config.sdk_url)


class PartnerApp:
    """The app's parts: configuration, the service client, ID token verifier, records, sessions."""

    def __init__(self, config: PartnerConfig):
        self.config = config
        self.platform = PlatformClient(config)
        self.jwks = JwksCache(config.jwks_url, config.jwks_min_refresh_seconds)
        self.verifier = IdTokenVerifier(self.jwks, config.issuer_claim, config.client_id)
        self.records = UserRecords(config.authorized_users, config.upgraded_organizations)
        self.sessions = SessionStore(config.session_ttl)
        self.authorizations = PendingAuthorizations()

    def use_secrets(self, client_secret: str, fallback_secret: str = "") -> None:
        """Rotation steps 2 and 4 without a restart: configure (current, fallback), then promote.

        Calls already under way finish with the pair they started with."""
        self.config = dataclasses.replace(self.config, client_secret=client_secret, fallback_secret=fallback_secret)
        self.platform.config = self.config


SECRET_PARAMS = frozenset(("launch_id", "launch", "code", "state", "login_hint", "access_token", "id_token"))
"""Query parameters whose values never reach the access log: a launch id and an authorization
code are credentials until used (as svc-auth's own log redacts them)."""


def redacted_uri(uri: str) -> str:
    """`uri` with the value of each `SECRET_PARAMS` parameter (its name decoded, any case) replaced by `[REDACTED]`."""
    path, mark, query = uri.partition("?")
    if not mark:
        return uri
    pairs = []
    for pair in query.split("&"):
        name, equals, _ = pair.partition("=")
        pairs.append(f"{name}=[REDACTED]" if equals and unquote_plus(name).lower() in SECRET_PARAMS else pair)
    return f"{path}?{'&'.join(pairs)}"


def log_request(handler: tornado.web.RequestHandler) -> None:
    """Tornado's access line (status, method, URI, address, duration) with `redacted_uri`."""
    status = handler.get_status()
    log = (tornado.log.access_log.info if status < 400 else
           tornado.log.access_log.warning if status < 500 else tornado.log.access_log.error)
    request = handler.request
    log("%d %s %s (%s) %.2fms", status, request.method, redacted_uri(request.uri or ""), request.remote_ip,
        1000.0 * request.request_time())


def make_partner_app(config: PartnerConfig) -> tornado.web.Application:
    partner = PartnerApp(config)
    return tornado.web.Application([
        (r"/launch", LaunchHandler),
        (r"/api/token", AppTokenHandler),
        (r"/api/session", SessionHandler),
        (r"/api/me", MeHandler),
        (r"/api/activation", ActivationHandler),
        (r"/app", MainPageHandler),
        (r"/app/([^/]+)", MainPageHandler),
    ], partner=partner, template_path=str(HERE / "templates"), static_path=str(HERE / "static"),
        xsrf_cookies=False, log_function=log_request)
