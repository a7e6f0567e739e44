"""The redirect_uri rule (RFC 6749 3.1.2, RFC 9700 4.1, RFC 3986 6.2.2, OIDC Core 3.1.2.1).

Every candidate is first *normalised* the way a browser will read it: scheme and host lower-cased,
the default port dropped, backslashes read as `/`, percent-encoded unreserved characters decoded
(`%2e` is `.`, `%7E` is `~`), other percent-encodings upper-cased, dot segments removed (RFC 3986
5.2.4). URIs whose meaning is not certain are refused: control characters, spaces or non-ASCII
text, a fragment, user info, empty path segments, encoded `/`, `\\` or `%` in the path, broken percent-encodings, and a
query that already carries `code`, `state`, `error` or `iss` (the answer's own parameters).

The normalised URI is then compared with the registered one: `prefix` mode (the default, the
spec's manifest rule) accepts the base itself or any path below it on a `/` boundary, with the
same scheme, host and port; `exact` mode accepts only one of the registered URIs. The service
redirects to the normalised URI only, so what is checked is what the browser visits.
"""
from __future__ import annotations

from types import MappingProxyType

import re
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

_DEFAULT_PORTS = MappingProxyType({"http": 80, "https": 443})
MATCH_MODES = ("prefix", "exact")
RESPONSE_PARAMS = frozenset({"code", "state", "error", "error_description", "error_uri", "iss", "id_token",
                             "access_token"})
_UNRESERVED = re.compile(r"[A-Za-z0-9\-._~]")
_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")
_ALLOWED = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no space (fullmatch: `$` lets a final newline by)


class RedirectUriError(ValueError):
    """The URI cannot be used as a redirect_uri; the message says why."""


def _normalise_percent(text: str, what: str, forbid: set[str]) -> str:
    """Decode %XX of unreserved characters, upper-case the rest; refuse broken or ambiguous ones."""
    if re.search(r"%(?![0-9A-Fa-f]{2})", text):
        raise RedirectUriError(f"the {what} has a malformed percent-encoding")

    def one(match):
        char = chr(int(match[1], 16))
        if _UNRESERVED.fullmatch(char):
            return char
        if char in forbid or ord(char) < 0x20 or ord(char) == 0x7f:
            raise RedirectUriError(f"the {what} contains an encoded {char!r}, which servers read differently")
        return "%" + match[1].upper()
    return _PERCENT.sub(one, text)


def remove_dot_segments(path: str) -> str:
    """RFC 3986 5.2.4."""
    output: list[str] = []
    segments = path.split("/")
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == ".":
            if last:
                output.append("")
        elif segment == "..":
            if len(output) > 1:
                output.pop()
            if last:
                output.append("")
        else:
            output.append(segment)
    result = "/".join(output)
    if path.startswith("/") and not result.startswith("/"):
        result = "/" + result
    return result


def normalise_redirect_uri(uri: str) -> str:
    """The URI as a browser will follow it, or `RedirectUriError` when it is unusable or ambiguous."""
    if not isinstance(uri, str) or not uri:
        raise RedirectUriError("the redirect_uri is empty")
    if not _ALLOWED.fullmatch(uri):
        raise RedirectUriError("the redirect_uri contains spaces, control characters or non-ASCII text")
    if "#" in uri:
        raise RedirectUriError("the redirect_uri must not have a fragment")
    # Browsers read `\` as `/` in http(s) URLs (WHATWG URL); read it the same way before anything else.
    uri = uri.replace("\\", "/")
    try:
        parts = urlsplit(uri)
    except ValueError:  # e.g. `http://[::1`: an unclosed IPv6 literal
        raise RedirectUriError("the redirect_uri is not a URL") from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise RedirectUriError("the redirect_uri must be an absolute http(s) URL")
    if not uri[len(parts.scheme):].startswith("://"):
        raise RedirectUriError("the redirect_uri must be an absolute http(s) URL")
    if "@" in parts.netloc:
        raise RedirectUriError("the redirect_uri must not carry user information")
    netloc = parts.netloc
    host_text = netloc[:netloc.index("]") + 1] if netloc.startswith("[") and "]" in netloc else netloc.rsplit(":", 1)[0]
    if (not re.fullmatch(r"[A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\]", host_text) or not parts.hostname
            or not re.fullmatch(r"(:[0-9]*)?", netloc[len(host_text):])):  # `[::1]x`: no URL a browser follows
        raise RedirectUriError("the redirect_uri has no usable host")
    host = parts.hostname
    try:
        port = parts.port
    except ValueError:
        raise RedirectUriError("the redirect_uri has an invalid port") from None
    host = host.lower()
    netloc = f"[{host}]" if ":" in host else host
    if port is not None and port != _DEFAULT_PORTS[scheme]:
        netloc += f":{port}"
    path = _normalise_percent(parts.path, "path", {"/", "\\", "%"})
    if "//" in path:
        # Empty segments: browsers keep them, many servers collapse them (so `/app//..` is `/app/`
        # to one and `/` to the other).
        raise RedirectUriError("the redirect_uri's path has an empty segment (//)")
    if any(";" in segment and segment.split(";", 1)[0] in (".", "..") for segment in path.split("/")):
        # `..;x` is `..` to servers that strip path parameters (Tomcat, Spring): out of the base.
        raise RedirectUriError("the redirect_uri's path has a dot segment with parameters (..;)")
    path = remove_dot_segments(path or "/") or "/"
    query = _normalise_percent(parts.query, "query", {"%", "#"}) if parts.query else ""
    if query:
        names = {unquote(name).lower() for name, _ in parse_qsl(query, keep_blank_values=True)}
        taken = sorted(names & RESPONSE_PARAMS)
        if taken:
            raise RedirectUriError(f"the redirect_uri's query must not carry {', '.join(taken)}: "
                                   "the authorization response adds those")
    return urlunsplit((scheme, netloc, path, query, ""))


def _origin_and_path(normalised: str) -> tuple[str, str, str]:
    parts = urlsplit(normalised)
    return parts.scheme, parts.netloc, parts.path


def match_redirect_uri(candidate: str, registered: str, mode: str = "prefix",
                       registered_uris=()) -> str:
    """The normalised candidate when it matches the application's registration, else `RedirectUriError`.

    `prefix`: under the manifest base `registered` (same origin, path equal or below at a `/`).
    `exact`: equal, after normalisation, to `registered` or one of `registered_uris`."""
    normalised = normalise_redirect_uri(candidate)
    if mode == "exact":
        allowed = set()
        for uri in (registered, *registered_uris):
            try:
                allowed.add(normalise_redirect_uri(uri))
            except RedirectUriError:
                continue
        if normalised not in allowed:
            raise RedirectUriError("the redirect_uri is not one of the application's registered redirect URIs")
        return normalised
    base = normalise_redirect_uri(registered)
    scheme, netloc, path = _origin_and_path(normalised)
    base_scheme, base_netloc, base_path = _origin_and_path(base)
    if (scheme, netloc) != (base_scheme, base_netloc):
        raise RedirectUriError("the redirect_uri is not on the application's redirect origin")
    if path != base_path and not path.startswith(base_path if base_path.endswith("/") else base_path + "/"):
        raise RedirectUriError("the redirect_uri is not under the application's redirect base URL")
    return normalised


def redirect_uri_allowed(candidate: str, registered: str) -> bool:
    """Prefix-mode match as a yes/no (URL validation of manifests uses it too)."""
    try:
        match_redirect_uri(candidate, registered)
    except RedirectUriError:
        return False
    return True


def with_query(url: str, **params) -> str:
    """`url` with `params` appended to its query; the URL's own text is kept byte for byte.

    None values are skipped. The URL is one `normalise_redirect_uri` returned, so it carries no
    parameter of the same name (nothing to override or shadow)."""
    parts = urlsplit(url)
    added = urlencode([(k, v) for k, v in params.items() if v is not None])
    query = f"{parts.query}&{added}" if parts.query and added else (parts.query or added)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))
