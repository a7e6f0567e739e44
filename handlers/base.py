"""`BaseHandler`: JSON in and out, request parsing and the one renderer of errors."""
from __future__ import annotations

import json
import logging
from urllib.parse import parse_qsl

import tornado.web

from audit.disclosures import Disclosure, without_signature
from ops.jsontext import compact_json
from conf.logging import redact
from errors import ApiError
from oauth.errors import OAuthError, invalid_request
from oauth.params import MAX_JSON_DEPTH, check_fields
from ops.observability import bind_request_id, request_id_for
from ops.proxy import client_address

log = logging.getLogger("svc_auth.http")


def _nesting_exceeds(text: str, limit: int) -> bool:
    """True when brackets outside strings nest deeper than `limit` (checked before parsing, so
    a deep document never reaches the recursive parser)."""
    if text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth -= 1
    return False


class JsonBodyError(ValueError):
    """A request body that is no JSON document svc-auth takes; its message says why (for the client)."""


def _unique_members(pairs: list) -> dict:
    """`json.loads`' object hook: a member named twice is refused, as a repeated form or query
    parameter is (RFC 8259 4: names SHOULD be unique; last-wins would let one value hide another)."""
    members = {}
    for name, value in pairs:
        if name in members:
            raise JsonBodyError(f"The JSON body has the member {json.dumps(name)[:80]} more than once.")
        members[name] = value
    return members


def json_document(text: str):
    """The one parser of JSON request bodies (OAuth, the partner and sandbox APIs, Bulk Data kick-offs):
    nested at most `MAX_JSON_DEPTH` deep (checked before parsing), valid JSON, no member repeated in
    any object; else `JsonBodyError`, which each caller answers as a 400 in its own shape."""
    if _nesting_exceeds(text, MAX_JSON_DEPTH):
        raise JsonBodyError(f"The JSON body is nested more than {MAX_JSON_DEPTH} levels deep.")
    try:
        return json.loads(text, object_pairs_hook=_unique_members)
    except JsonBodyError:
        raise
    except (ValueError, RecursionError):
        raise JsonBodyError("The request body is not valid JSON.") from None


NO_RESOURCES_CSP = "default-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
"""The CSP of an HTML page that loads nothing, runs nothing and posts nothing (an error page)."""


class BaseHandler(tornado.web.RequestHandler):
    """Every handler's base. Errors raised as `ApiError` become `{"error", "message"}` JSON."""

    @property
    def runtime(self):
        return self.application.settings["runtime"]

    async def run(self, fn, /, *args, **kwargs):
        """Await blocking domain work (database, S3, queue) off the IOLoop: see `Runtime.run`."""
        return await self.runtime.run(fn, *args, **kwargs)

    @property
    def svc_settings(self):
        return self.runtime.settings

    def client_address(self) -> str:
        """The caller's address (X-Forwarded-For only through SVC_TRUSTED_PROXIES)."""
        return client_address(self.request, self.svc_settings)

    def request_disclosure(self, action: str, **fields) -> Disclosure:
        """The disclosure audit's view of this request: where from, its id, its query (audit/)."""
        return Disclosure(action=action, source_address=self.client_address(), request_id=request_id_for(self.request),
                          query=without_signature(self.request.query), **fields)

    def clear(self):
        self._svc_bound_request_id = None  # the headers go: set_default_headers binds the id again
        self._svc_no_store = False
        super().clear()

    def set_default_headers(self):
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Referrer-Policy", "no-referrer")
        bind_request_id(self)

    def prepare(self):
        bind_request_id(self)  # again: a subclass may override set_default_headers
        body = self.request.body  # empty for most requests: no settings to look up then
        if body and len(body) > self.svc_settings.max_body_bytes:
            raise ApiError(413, "request_too_large",
                           f"The request body is larger than {self.svc_settings.max_body_bytes} bytes.")

    # -- input ---------------------------------------------------------------------------
    def body_params(self, allow_form: bool = True) -> dict:
        """The request body as a dict: a JSON object, or (when allowed) a form."""
        content_type = (self.request.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        raw = self.request.body or b""
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise invalid_request("The request body is not valid UTF-8.") from None
        if content_type == "application/json" or (not content_type and text.lstrip().startswith("{")):
            if not text.strip():
                return {}
            try:
                value = json_document(text)
            except JsonBodyError as exc:
                raise invalid_request(str(exc)) from None
            if not isinstance(value, dict):
                raise invalid_request("The JSON body must be an object.")
            check_fields(value)
            return value
        if allow_form and content_type in ("application/x-www-form-urlencoded", ""):
            return self._form_fields(text)
        accepted = "application/json or application/x-www-form-urlencoded" if allow_form else "application/json"
        # RFC 6749-shaped (error + error_description) so OAuth clients can read it too.
        raise OAuthError("invalid_request", f"Content-Type must be {accepted}.", status=415)

    def form_params(self) -> dict:
        """An `application/x-www-form-urlencoded` body only (an empty body is no parameters):
        any other content type, or none with a body, is 415."""
        raw = self.request.body or b""
        if not raw:
            return {}
        content_type = (self.request.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if content_type != "application/x-www-form-urlencoded":
            raise OAuthError("invalid_request", "Content-Type must be application/x-www-form-urlencoded.", status=415)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise invalid_request("The request body is not valid UTF-8.") from None
        return self._form_fields(text)

    def query_and_form_params(self) -> dict:
        """The query's and the form body's parameters as one: a name in both is a 400 (as a
        repeated one is), never last-wins."""
        query, form = self.query_params(), self.form_params()
        both = sorted(query.keys() & form.keys())
        if both:
            raise invalid_request(f"The {both[0]} parameter is given in both the query and the body.")
        return {**query, **form}

    @staticmethod
    def _form_fields(text: str) -> dict:
        """A form's fields, one value each (a repeated one is an error), %-escapes strictly UTF-8
        (as `query_params` reads a query: `%FF` is refused, never read as U+FFFD)."""
        try:
            pairs = parse_qsl(text, keep_blank_values=True, errors="strict")
        except UnicodeDecodeError:
            raise invalid_request("The request body has a %-escape that is not valid UTF-8.") from None
        params: dict = {}
        for key, value in pairs:
            if key in params:
                raise invalid_request(f"The {key} parameter is repeated.")
            params[key] = value
        check_fields(params)
        return params

    def query_params(self) -> dict:
        """Query parameters, one value each (a repeated parameter is an error)."""
        params = {}
        for key, values in self.request.query_arguments.items():
            if len(values) > 1:
                raise invalid_request(f"The {key} parameter is repeated.")
            try:
                params[key] = values[0].decode("utf-8")
            except UnicodeDecodeError:
                raise invalid_request(f"The {key} parameter is not valid UTF-8.") from None
        check_fields(params)
        return params

    # -- output --------------------------------------------------------------------------
    def no_store(self) -> None:
        """`Cache-Control: no-store`, and no `ETag`: nobody may keep this answer, so nobody can
        revalidate it (If-None-Match), and hashing the body for a validator is waste."""
        self.set_header("Cache-Control", "no-store")
        self._svc_no_store = True

    def compute_etag(self):
        return None if self._svc_no_store else super().compute_etag()

    def check_etag_header(self) -> bool:
        return not self._svc_no_store and super().check_etag_header()

    def html_headers(self, csp: str) -> None:
        """Every HTML page's headers: UTF-8 HTML, its Content-Security-Policy, and never framed
        (X-Frame-Options for browsers that ignore `frame-ancestors`)."""
        self.set_header("Content-Type", "text/html; charset=UTF-8")
        self.set_header("Content-Security-Policy", csp)
        self.set_header("X-Frame-Options", "DENY")

    def write_json(self, value, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        self.finish(compact_json(value))

    def write_error(self, status_code: int, **kwargs):
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, ApiError):
            body = exc.body()
            for name, value in exc.headers.items():
                self.set_header(name, value)
        elif isinstance(exc, tornado.web.HTTPError) and status_code < 500:
            code = {404: "not_found", 405: "method_not_allowed"}.get(status_code, "bad_request")
            body = {"error": code, "message": exc.log_message or self._reason}
        else:
            body = {"error": "server_error", "message": "The server could not complete the request."}
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        self.no_store()
        self.finish(json.dumps(body, separators=(",", ":")))

    def send_error(self, status_code: int = 500, **kwargs) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, ApiError):
            status_code = exc.status
        super().send_error(status_code, **kwargs)

    def _request_summary(self) -> str:
        return f"{self.request.method} {redact(self.request.uri)}"

    def log_exception(self, typ, value, tb):
        if isinstance(value, ApiError):
            return  # a client error, rendered for the client; not a server fault
        super().log_exception(typ, value, tb)


class NotFoundHandler(BaseHandler):
    """Unknown paths: JSON 404 rather than Tornado's HTML page."""

    def prepare(self):
        super().prepare()
        raise ApiError(404, "not_found", "No such resource.")
