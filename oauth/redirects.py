"""The redirect_uri rule: equal to the registered base URL, or under it on a `/` boundary."""
from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(parts) -> tuple[str, str, int | None]:
    try:
        port = parts.port
    except ValueError:
        return ("", "", None)
    return (parts.scheme.lower(), (parts.hostname or "").lower(), port or _DEFAULT_PORTS.get(parts.scheme.lower()))


def redirect_uri_allowed(candidate: str, registered: str) -> bool:
    """Same scheme, host and port as `registered`; path equal to it or below it at a `/`."""
    if not candidate or any(c in candidate for c in "\r\n\t ") or "#" in candidate:
        return False
    cand, reg = urlsplit(candidate), urlsplit(registered)
    if cand.username is not None or cand.password is not None:
        return False
    if _origin(cand) != _origin(reg) or not cand.hostname:
        return False
    base = reg.path or "/"
    path = cand.path or "/"
    if ".." in path.split("/"):
        return False
    if path == base:
        return True
    prefix = base if base.endswith("/") else base + "/"
    return path.startswith(prefix)


def with_query(url: str, **params) -> str:
    """`url` with `params` added to its query (existing parameters kept); None values skipped."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    query += [(k, v) for k, v in params.items() if v is not None]
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), parts.fragment))
