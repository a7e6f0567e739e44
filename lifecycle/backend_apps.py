"""Backend apps (SMART Backend Services): an application's public keys and system scopes.

`set_backend_keys` registers where the app's keys are: a JWKS URL (https, or http on a loopback
address, for development), fetched by svc-auth (`oauth.client_jwks`), or a JWKS stored whole
(validated: public keys only, RSA >= 2048 bits or EC P-384; `oauth.client_keys`). One replaces the
other. `set_system_scopes` registers what the app may ask (`oauth.system_scopes`). Both audited;
every process hears of the change (app_cache).
"""
from __future__ import annotations

import ipaddress
import json
from urllib.parse import urlsplit

from app_cache.applications import TOPIC as APPLICATIONS
from lifecycle.applications import find_application, record_change
from lifecycle.organizations import invalid
from models.application import Application
from models.audit import AuditEvent
from oauth.client_keys import JwksError, parse_jwks
from oauth.system_scopes import validate_registered


def _loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def jwks_url_problem(url) -> str | None:
    """Why `url` cannot be a JWKS URL, or None: an absolute https URL (http only on a loopback
    address), no credentials or fragment, at most 500 characters."""
    if not isinstance(url, str) or not url or len(url) > 500 or any(c <= " " or c == "\x7f" for c in url):
        return "the JWKS URL must be an absolute https URL of at most 500 characters"
    try:
        parts = urlsplit(url)
        parts.port
    except ValueError:
        return "the JWKS URL is not a valid URL"
    if not parts.hostname or parts.username is not None or parts.password is not None or parts.fragment:
        return "the JWKS URL must be an absolute URL without credentials or a fragment"
    if parts.scheme == "https" or (parts.scheme == "http" and _loopback(parts.hostname)):
        return None
    return "the JWKS URL must be https (http only on a loopback address, for development)"


def set_backend_keys(runtime, application_id: str, jwks_url: str | None = None, jwks_text: str | None = None,
                     actor: str = "operator") -> Application:
    """Register the app's keys: `jwks_url` or `jwks_text` (a JWKS document), replacing the other;
    both None removes them (the app can no longer authenticate with a key pair)."""
    if jwks_url is not None and jwks_text is not None:
        raise invalid("Give a JWKS URL or a JWKS, not both.")
    app = find_application(application_id)
    stored = None
    if jwks_url is not None:
        problem = jwks_url_problem(jwks_url)
        if problem:
            raise invalid(f"jwks_url: {problem}.")
    if jwks_text is not None:
        try:
            stored = json.dumps(parse_jwks(jwks_text, strict=True), separators=(",", ":"))
        except JwksError as exc:
            raise invalid(f"jwks: {exc}.") from None
    app.jwks_url, app.jwks = jwks_url, stored
    return record_change(runtime, app, actor, "application.jwks_set", jwks_url=jwks_url,
                         kids=[k["kid"] for k in json.loads(stored)["keys"]] if stored else None)


def set_system_scopes(runtime, application_id: str, scope: str, actor: str = "operator") -> Application:
    """The system scopes the app may ask (`system/Patient.rs ...`, `system/*.rs`); "" for none."""
    try:
        normalised = validate_registered(scope)
    except ValueError as exc:
        raise invalid(f"system_scopes: {exc}.") from None
    app = find_application(application_id)
    app.system_scopes = normalised
    return record_change(runtime, app, actor, "application.system_scopes_set", system_scopes=normalised)
