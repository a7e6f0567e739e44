"""OAuth's errors (RFC 6749 5.2, authorize redirects; RFC 6750's are `oauth.bearer`'s) over `errors.ApiError`; `handlers.base` renders them."""
from __future__ import annotations

import re

from errors import ApiError, OAuthError  # noqa: F401  (OAuthError lives in errors/: ratelimit/lockout.py raises it too)


def invalid_request(description: str) -> OAuthError:
    return OAuthError("invalid_request", description)


def invalid_client(description: str = "Client authentication failed.", basic: bool = False) -> OAuthError:
    headers = {"WWW-Authenticate": 'Basic realm="svc-auth"'} if basic else {}
    return OAuthError("invalid_client", description, status=401, headers=headers)


def invalid_grant(description: str) -> OAuthError:
    return OAuthError("invalid_grant", description)


def temporarily_unavailable(description: str, retry_after: int) -> OAuthError:
    """503 + Retry-After: the request did nothing that needs undoing and can be retried then.
    RFC 6749's `temporarily_unavailable`, in both shapes."""
    return OAuthError("temporarily_unavailable", description, status=503, headers={"Retry-After": str(retry_after)})


def dependency_unavailable(dependency: str, retry_after: int = 2) -> OAuthError:
    """503 + Retry-After: a dependency (the database) cannot be reached."""
    return temporarily_unavailable(f"The {dependency} cannot be reached right now; retry in {retry_after} seconds.",
                                   retry_after)


MAX_REDIRECT_DESCRIPTION = 500
_NOT_DESCRIPTION = re.compile(r"[^\x20-\x21\x23-\x5b\x5d-\x7e]")


def redirect_description(description: str) -> str:
    """`description` as an authorization response's `error_description` may carry it (RFC 6749
    4.1.2.1: printable ASCII without `"` or `\\`; anything else becomes `?`), at most 500 characters."""
    return _NOT_DESCRIPTION.sub("?", description)[:MAX_REDIRECT_DESCRIPTION]


class AuthorizeError(Exception):
    """An authorize-endpoint error. `redirect_uri` set: send it back to the client (RFC 6749
    4.1.2.1); unset: the client or redirect_uri is not trusted, so show it, never redirect."""

    def __init__(self, error: str, description: str, redirect_uri: str | None = None, state: str | None = None):
        super().__init__(description)
        self.error = error
        self.description = description
        self.redirect_uri = redirect_uri
        self.state = state
