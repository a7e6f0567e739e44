"""Which browser origins may call the app's endpoints: the service's, as configured."""
from __future__ import annotations

from urllib.parse import urlsplit


def origin_allowed(origin: str | None, patterns, own_origin: str) -> bool:
    """True for the app's own origin and for origins matching a pattern.

    A pattern is an exact origin (`https://hub.example.com`) or a wildcard host under a domain
    (`https://*.example.com` matches `https://a.b.example.com`, not `https://example.com`).
    """
    if not origin or origin == "null":
        return False
    if origin == own_origin:
        return True
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path or parts.query:
        return False
    for pattern in patterns:
        if origin == pattern:
            return True
        want = urlsplit(pattern)
        if want.hostname and want.hostname.startswith("*.") and want.scheme == parts.scheme:
            suffix = want.hostname[1:]  # ".example.com"
            if parts.hostname.endswith(suffix) and want.port == parts.port:
                return True
    return False
