"""The app's own sessions (the optional SSO step): opaque random tokens kept in memory."""
from __future__ import annotations

import secrets
import time


class SessionStore:
    def __init__(self, ttl: int, clock=time.time):
        self.ttl = ttl
        self._clock = clock
        self._sessions: dict[str, dict] = {}

    def open(self, claims: dict) -> tuple[str, dict]:
        self._prune()
        token = secrets.token_urlsafe(32)
        session = {"sub": claims["sub"], "email": claims.get("email"), "given_name": claims.get("given_name"),
                   "family_name": claims.get("family_name"), "expires_at": int(self._clock()) + self.ttl}
        self._sessions[token] = session
        return token, session

    def get(self, token: str | None) -> dict | None:
        session = self._sessions.get(token or "")
        if session is None or session["expires_at"] <= self._clock():
            return None
        return session

    def _prune(self) -> None:
        now = self._clock()
        for token in [t for t, s in self._sessions.items() if s["expires_at"] <= now]:
            del self._sessions[token]
