"""The error every layer raises for a client: an HTTP status, a snake_case code and a message.

`handlers.base` renders it (one place) as `{"error", "message"}`; OAuth's RFC 6749 shape
(`OAuthError`, re-exported by `oauth.errors`) extends it; it lives here so that `ratelimit.lockout`
can raise it without importing `oauth`.
"""
from __future__ import annotations


class ApiError(Exception):
    """A client error with an HTTP status and a snake_case code: `{"error", "message"}`."""

    def __init__(self, status: int, error: str, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.error = error
        self.message = message
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return {"error": self.error, "message": self.message}


class OAuthError(ApiError):
    """RFC 6749 section 5.2 error: also carries `error_description`."""

    def __init__(self, error: str, description: str, status: int = 400, headers: dict | None = None):
        super().__init__(status, error, description, headers)

    def body(self) -> dict:
        return {"error": self.error, "error_description": self.message, "message": self.message}
