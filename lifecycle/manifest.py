"""Changing an application's manifest: name, launch URL, redirect base URL, token endpoint (or
none, the identity-provider variant), allowed URLs/origins and declared user-field permissions.

One function validates and applies a change for every caller (the console and `svc-auth apps
update`), writes one audit event naming the actor and what changed, and is the place where a
changed application is announced to every process (the authorize rule and userinfo read the
application row on each request).
"""
from __future__ import annotations

from urllib.parse import urlsplit

from hotcache.applications import TOPIC as APPLICATIONS
from lifecycle.registry import find_application
from models.application import USER_FIELDS, Application
from models.audit import AuditEvent
from oauth.errors import ApiError
from oauth.redirects import RedirectUriError, normalise_redirect_uri, redirect_uri_allowed

# The spec's subsections of "User permissions (read)", in its order.
PERMISSION_GROUPS = (
    ("Identity", (("email", "Email address"),)),
    ("Name", (("name", "Given and family name"),)),
    ("EHR", (("ehrUsername", "EHR username"),)),
    ("Organization", (("organization", "Organization (clinic) id and name"),)),
)

FIELDS = ("name", "launch_url", "redirect_uri", "token_endpoint", "allowed_origins", "user_fields")
URL_LABELS = {"launch_url": "The launch URL", "redirect_uri": "The redirect base URL",
              "token_endpoint": "The token endpoint URL"}


class ManifestInvalid(ApiError):
    """400 with a message per field (`fields`), so a form can show each beside its control."""

    def __init__(self, fields: dict[str, str]):
        super().__init__(400, "invalid_manifest", " ".join(fields.values()))
        self.fields = fields

    def body(self) -> dict:
        return {**super().body(), "fields": self.fields}


def url_problem(label: str, value: str) -> str | None:
    """Why `value` is not an absolute http(s) URL without credentials or fragment, or None."""
    if not value:
        return f"{label} is required."
    if len(value) > 500:
        return f"{label} must be at most 500 characters."
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not redirect_uri_allowed(value, value):
        return f"{label} must be an absolute http(s) URL without a fragment or credentials."
    return None


def origin_problem(value: str) -> str | None:
    problem = url_problem("An allowed URL", value)
    return f"{problem[:-1]}: {value!r}." if problem else None


def validate(changes: dict) -> dict:
    """Normalised changes; raises `ManifestInvalid` naming every bad field."""
    unknown = sorted(set(changes) - set(FIELDS))
    if unknown:
        raise ManifestInvalid({name: f"{name} is not a manifest field." for name in unknown})
    errors: dict[str, str] = {}
    clean: dict = {}
    for key, value in changes.items():
        if key == "name":
            value = (value or "").strip() if isinstance(value, str) else value
            if not isinstance(value, str) or not value or len(value) > 200:
                errors[key] = "The name must be 1 to 200 characters."
        elif key in ("launch_url", "redirect_uri"):
            value = (value or "").strip() if isinstance(value, str) else ""
            problem = url_problem(URL_LABELS[key], value)
            if not problem and key == "redirect_uri":
                try:  # the authorize rule's own normalisation (RFC 3986) must accept it
                    normalise_redirect_uri(value)
                except RedirectUriError as exc:
                    problem = f"The redirect base URL cannot be used: {exc}."
            if problem:
                errors[key] = problem
        elif key == "token_endpoint":
            # Empty means none: the identity-provider variant has no token endpoint in the manifest.
            value = (value or "").strip() or None if isinstance(value, (str, type(None))) else value
            if value is not None:
                problem = url_problem(URL_LABELS[key], value) if isinstance(value, str) else "Must be a URL."
                if problem:
                    errors[key] = problem
        elif key == "allowed_origins":
            value = [v.strip() for v in (value or []) if isinstance(v, str) and v.strip()]
            value = list(dict.fromkeys(value))
            problems = [p for p in (origin_problem(v) for v in value) if p]
            if problems:
                errors[key] = " ".join(problems)
            elif len(value) > 50:
                errors[key] = "At most 50 allowed URLs."
        elif key == "user_fields":
            value = [v for v in (value or []) if isinstance(v, str)]
            unknown_fields = [v for v in value if v not in USER_FIELDS]
            if unknown_fields:
                errors[key] = (f"Unknown user field(s) {', '.join(unknown_fields)}; "
                               f"choose from {', '.join(USER_FIELDS)}.")
            value = [f for f in USER_FIELDS if f in value]  # canonical order, no repeats
        clean[key] = value
    if errors:
        raise ManifestInvalid(errors)
    return clean


def manifest_of(app: Application) -> dict:
    return {"name": app.name, "launch_url": app.launch_url, "redirect_uri": app.redirect_uri,
            "token_endpoint": app.token_endpoint, "allowed_origins": list(app.allowed_origins or []),
            "user_fields": list(app.user_fields or [])}


def update_manifest(runtime, application_id: str, actor: str, **changes) -> Application:
    """Apply `changes` (a subset of `FIELDS`) to the application; audited with `actor`.

    Returns the updated application. Unchanged values write nothing and record nothing.
    `runtime` is where the change is announced to every process (the application caches)."""
    app = find_application(application_id)
    clean = validate(changes)
    before = manifest_of(app)
    changed = {key: value for key, value in clean.items() if before[key] != value}
    if not changed:
        return app
    columns = dict(changed)
    if "redirect_uri" in changed and app.redirect_uri_match == "exact":
        # In exact mode the manifest URI is the first registered one: it is replaced, the others stay.
        columns["redirect_uris"] = [changed["redirect_uri"],
                                    *[u for u in app.redirect_uris if u not in (app.redirect_uri, changed["redirect_uri"])]]
    with runtime.db.atomic():
        Application.update(**columns).where(Application.id == app.id).execute()
        AuditEvent.record(actor, "application.manifest_updated", app.id,
                          before={k: before[k] for k in changed}, after=changed)
    runtime.changes.announce(APPLICATIONS)  # every process drops its cached copy now
    return Application.get_by_id(app.id)
