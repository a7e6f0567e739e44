"""CORS for an application's own browser code calling the OAuth endpoints (`--allowed-origin`).

A preflight carries no credentials, so it is answered for any origin some application registered
(every registered origin is held in the application cache, read once per change to applications:
a preflight from anyone never scans the applications table);
the real response names the calling application (client_id in the body or HTTP Basic, or the
access token's client) and carries `Access-Control-Allow-Origin` only when that application
registered the request's origin. A browser on any other origin cannot read the answer.
"""
from __future__ import annotations

from types import MappingProxyType

from urllib.parse import urlsplit

from models.application import Application

_DEFAULT_PORTS = MappingProxyType({"http": 80, "https": 443})
ALLOWED_METHODS = "GET, POST, OPTIONS"
ALLOWED_HEADERS = "Authorization, Content-Type, Prefer"
"""Request headers a browser may send (none of them CORS-safelisted): the bearer token, a JSON or form
body's type, and the FHIR API's `Prefer: handling=strict` (docs/fhir-api.md)."""
MAX_AGE_SECONDS = 600


def normalize_origin(value: str | None) -> str | None:
    """`scheme://host[:port]` in lower case without a default port, or None when not an origin."""
    if not value or not isinstance(value, str) or value == "null":
        return None
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/") or parts.query:
        return None
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}" + (f":{port}" if port and port != _DEFAULT_PORTS[scheme] else "")


def _registered(app: Application) -> set[str]:
    return {o for o in (normalize_origin(v) for v in app.allowed_origins or ()) if o}


def origin_allowed_for_client(applications, client_id: str | None, origin: str | None) -> bool:
    """True when the application `client_id` registered `origin` (`applications`: the runtime's
    cache, which the same request's client authentication reads too)."""
    origin = normalize_origin(origin)
    if origin is None or not isinstance(client_id, str):
        return False
    app = applications.by_client_id(client_id)
    return app is not None and origin in _registered(app)


def registered_origins() -> frozenset[str]:
    """Every origin some application registered, normalized: reads every application (the
    application cache calls it once per change: `ApplicationCache.origins`)."""
    return frozenset(o for app in Application.select(Application.allowed_origins) for o in _registered(app))


def origin_registered(origins: frozenset[str], origin: str | None) -> bool:
    """True when `origin` is one of `origins` (`registered_origins()`) once normalized: enough to
    answer a preflight."""
    origin = normalize_origin(origin)
    return origin is not None and origin in origins
