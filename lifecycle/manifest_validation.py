"""The one validation of an application's manifest: registration (`svc-auth apps create`), the
console and `svc-auth apps update` all call `validate`, so a value one of them accepts works
everywhere (an allowed origin is an origin, which CORS matches, never a URL with a path)."""
from __future__ import annotations

from types import MappingProxyType

from urllib.parse import urlsplit

from models.application import USER_FIELDS
from oauth.cors import normalize_origin
from errors import ApiError
from oauth.redirects import RedirectUriError, normalise_redirect_uri, redirect_uri_allowed

FIELDS = ("name", "launch_url", "redirect_uri", "token_endpoint", "allowed_origins", "user_fields")
URL_LABELS = MappingProxyType({"launch_url": "The launch URL", "redirect_uri": "The redirect base URL",
                               "token_endpoint": "The token endpoint URL"})


class ManifestInvalid(ApiError):
    """400 with a message per field (`fields`), so a form can show each beside its control."""

    def __init__(self, fields: dict[str, str]):
        super().__init__(400, "invalid_manifest", " ".join(f"{name}: {problem}" for name, problem in fields.items()))
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
    """Why `value` is not an origin CORS can match (a URL with a path would be ignored), or None."""
    if normalize_origin(value) is None:
        return f"An allowed origin is scheme://host[:port] with no path, like https://app.example; got {value!r}."
    return None


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
            problem = None
            if key == "redirect_uri" and value:
                try:  # the authorize rule's own normalisation (RFC 3986) must accept it, and says why not
                    normalise_redirect_uri(value)
                except RedirectUriError as exc:
                    problem = f"The redirect base URL cannot be used: {exc}."
            problem = problem or url_problem(URL_LABELS[key], value)
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
            problems = [p for p in (origin_problem(v) for v in value) if p]
            value = list(dict.fromkeys(normalize_origin(v) for v in value))
            if problems:
                errors[key] = " ".join(problems)
            elif len(value) > 50:
                errors[key] = "At most 50 allowed origins."
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
