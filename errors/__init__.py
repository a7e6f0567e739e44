"""The error every layer raises for a client: an HTTP status, a snake_case code and a message.

`handlers.base` renders it (one place) as `{"error", "message"}`; OAuth's RFC 6749 shape
(`oauth.errors.OAuthError`) extends it.
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
