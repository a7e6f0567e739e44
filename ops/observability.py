"""The HTTP side of operations: request ids, the access log, request metrics, in-flight requests.

`ObservedApplication` is the Tornado application class: it counts requests in flight (so SIGTERM
can wait for them) and, when each request ends, writes one structured access-log line and
records its route pattern, status and latency in the metrics. `BaseHandler` binds the request id.
"""
from __future__ import annotations

import logging
import random
import re

import tornado.httputil
import tornado.web

from conf.logging import AccessRecord, redact, request_id_var, sole_json_handler
from ops.proxy import client_address, warn_if_misconfigured
from ops.routing import exact_routes, segment_routes

access_log = logging.getLogger("svc_auth.access")

REQUEST_ID_HEADER = "X-Request-Id"
_SANE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
UNMATCHED_ROUTE = "unmatched"


def request_id_for(request) -> str:
    """The caller's X-Request-Id if it is sane (letters, digits, `._:-`, at most 128), else a new
    one: 32 hex digits from the process's random generator (an id to correlate lines, not a
    secret: no `getrandom` syscall per request; `random` reseeds itself in a forked process)."""
    rid = getattr(request, "_svc_request_id", None)
    if rid is None:
        headers = request.headers  # `in` first: a missing header's `get` raises and catches a KeyError
        if REQUEST_ID_HEADER in headers and _SANE_REQUEST_ID.fullmatch(incoming := headers[REQUEST_ID_HEADER].strip()):
            rid = incoming
        else:
            rid = f"{random.getrandbits(128):032x}"
        request._svc_request_id = rid
    return rid


def bind_request_id(handler) -> str:
    """Make the request id current for log lines and echo it in the response (once per handler:
    `set_default_headers` and `prepare` both ask)."""
    rid = request_id_for(handler.request)
    if getattr(handler, "_svc_bound_request_id", None) != rid:
        request_id_var.set(rid)
        handler.set_header(REQUEST_ID_HEADER, rid)
        handler._svc_bound_request_id = rid
    return rid


def route_of(handler) -> str:
    """The route pattern that served `handler` (e.g. `/v1/oauth/token`), never the raw path."""
    app, cls = handler.application, type(handler)
    cache = app.route_patterns
    rule = app.exact_routes.get(handler.request.path)
    if rule is not None and rule.target is cls:  # found by its literal path (`find_handler`): no match to try
        known = cache.get(rule)
        if known is None:
            known = cache[rule] = _pattern(rule)
        return known
    known = cache.get(cls)
    if known is None:
        rules = [(rule, _pattern(rule)) for rule in app.wildcard_router.rules if rule.target is cls]
        known = cache[cls] = rules[0][1] if len(rules) == 1 else tuple(rules)
    if isinstance(known, str):
        return known
    for rule, pattern in known:  # one class mounted at several paths (e.g. /v1 and /os-api/v2)
        if rule.matcher.match(handler.request) is not None:
            return pattern
    return UNMATCHED_ROUTE


def _pattern(rule) -> str:
    pattern = getattr(rule.matcher, "regex", None)
    text = pattern.pattern if pattern is not None else str(rule.matcher)
    return text.rstrip("$").replace("\\", "")


def log_request(handler) -> None:
    """Tornado `log_function`: one access-log line and the request metrics, per request."""
    request = handler.request
    status = handler.get_status()
    seconds = request.request_time()
    route = route_of(handler)
    runtime = handler.application.settings.get("runtime")
    settings = runtime.settings if runtime is not None else None
    if runtime is not None:
        runtime.metrics.observe_request(route, request.method, status, seconds)
    if settings is not None and settings.trusted_proxies:
        warn_if_misconfigured(request, settings, access_log, handler.application.proxy_warnings)
    level = logging.INFO if status < 500 else logging.ERROR
    if access_log.isEnabledFor(level):
        fields = (request_id_for(request), request.method, route, redact(request.uri), status,
                  round(seconds * 1000, 2),
                  client_address(request, settings) if settings is not None else request.remote_ip)
        # Written straight to the JSON handler when it alone would get the record (`serve`), else
        # the record goes to the logger's handlers as `Logger.log` would hand it, less its walk up
        # the stack for a caller (file, line) that the JSON line never shows.
        json_handler = sole_json_handler(access_log, level)
        if json_handler is None or not json_handler.emit_access(access_log.name, level, *fields):
            access_log.handle(AccessRecord(access_log.name, level, *fields))


class InFlightDelegate(tornado.httputil.HTTPMessageDelegate):
    """Tornado's delegate for one request (`Application.get_handler_delegate`), wrapped: the request
    counts as in flight from its headers until its handler finishes (`log_request`), or until the
    connection drops before its handler ran (the body never came: nothing will log it)."""

    def __init__(self, application, request, delegate):
        self.application, self.request, self.delegate = application, request, delegate
        self.handler_started = False

    def headers_received(self, start_line, headers):
        self.application.in_flight += 1
        self.request._svc_in_flight = True
        return self.delegate.headers_received(start_line, headers)

    def data_received(self, chunk):
        return self.delegate.data_received(chunk)

    def finish(self):
        self.handler_started = True  # the whole request is in: Tornado runs its handler now
        return self.delegate.finish()

    def on_connection_close(self):
        if not self.handler_started:
            self.application.request_done(self.request)
        return self.delegate.on_connection_close()


class ObservedApplication(tornado.web.Application):
    """A Tornado application that knows how many requests it is serving and logs each one.

    Routing (`ops.routing`): a request for a literal path (`/healthz`, `/v1/oauth/token`, ...) finds
    its rule in one dict lookup; any other path tries only the rules that can match its first
    segment (`/fhir/...`: 7 of 60), in Tornado's order; a path no rule matches goes through
    Tornado's routing as before."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("log_function", log_request)
        super().__init__(*args, **kwargs)
        self.in_flight = 0
        self.route_patterns: dict = {}
        self.proxy_warnings: set = set()  # external origins already warned about (ops.proxy)
        self._route_tables()

    def _route_tables(self) -> None:
        # Only while every host is served the same routes (no add_handlers with a host pattern).
        one_host = len(self.default_router.rules) == 1
        self.exact_routes = exact_routes(self.wildcard_router.rules) if one_host else {}
        self.segment_routes = segment_routes(self.wildcard_router.rules) if one_host else None

    def find_handler(self, request, **kwargs):
        path = request.path
        rule = self.exact_routes.get(path)
        if rule is not None:
            return self.get_handler_delegate(request, rule.target, rule.target_kwargs)
        table = self.segment_routes
        if table is not None:
            segment = path[1:].partition("/")[0] if path.startswith("/") else None
            found = table.get(segment, table[None]).find(request)
            if found is not None:
                rule, path_args, path_kwargs = found
                return self.get_handler_delegate(request, rule.target, rule.target_kwargs, path_args, path_kwargs)
        return super().find_handler(request, **kwargs)

    def add_handlers(self, host_pattern, host_handlers) -> None:
        super().add_handlers(host_pattern, host_handlers)
        self.exact_routes, self.segment_routes = {}, None  # host-specific routes now: Tornado's routing decides

    def get_handler_delegate(self, request, target_class, target_kwargs=None, path_args=None, path_kwargs=None):
        return InFlightDelegate(self, request, super().get_handler_delegate(request, target_class, target_kwargs,
                                                                            path_args, path_kwargs))

    def request_done(self, request) -> None:
        if getattr(request, "_svc_in_flight", False):
            request._svc_in_flight = False
            self.in_flight -= 1

    def log_request(self, handler) -> None:
        self.request_done(handler.request)
        super().log_request(handler)
