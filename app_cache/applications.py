"""Applications (client id, secret hashes, manifest) in memory, dropped whenever any app changes.

Changes to applications are rare (registration, secret rotation, manifest edits) and each one is
announced on the `applications` topic, so dropping the whole cache then is simple and cheap. A
lookup that raced with a drop does not store what it read: it may be older than the change.

A client_id or id that is not there is remembered too (up to `MAX_MISSING` of them, then they
are forgotten all at once; one longer than any can be is not even looked up), so a spray of wrong secrets for unknown client_ids costs no database
round trip after the first, and an unknown client_id is answered as fast as a known one: timing
does not tell which exist either. A new application is announced like any change, which drops them.

Every origin some application registered (what a CORS preflight is answered for) is kept too, read
from every application once after each change, so an unauthenticated preflight is a set lookup and
never a scan of the applications table.
"""
from __future__ import annotations

import threading

from models.application import Application

TOPIC = "applications"


class ApplicationCache:
    MAX_MISSING = 10_000
    # No application has a longer id or client_id (the columns' width): a longer key is answered
    # None at once, neither looked up nor remembered (10,000 remembered 64 KiB client_ids from
    # unauthenticated requests held 640 MB in every process).
    MAX_KEY_LENGTH = max(Application.id.max_length, Application.client_id.max_length)

    def __init__(self):
        self._by_client_id: dict[str, Application] = {}
        self._by_id: dict[str, Application] = {}
        self._missing: set[tuple[str, str]] = set()  # (index, key) known to have no application
        self._origins: frozenset[str] | None = None  # every registered origin, None until read
        self._generation = 0
        self._lock = threading.Lock()
        self._origins_read = threading.Lock()  # one read of every origin at a time: a burst waits for it

    def clear(self) -> None:
        with self._lock:
            self._generation += 1
            self._by_client_id = {}
            self._by_id = {}
            self._missing = set()
            self._origins = None

    def _remember_missing(self, generation: int, entry: tuple[str, str]) -> None:
        with self._lock:
            if generation == self._generation:
                if len(self._missing) >= self.MAX_MISSING:
                    self._missing = set()
                self._missing.add(entry)

    def _remember(self, generation: int, app: Application) -> None:
        with self._lock:
            if generation == self._generation:
                self._by_client_id[app.client_id] = app
                self._by_id[app.id] = app

    def cached(self, client_id) -> Application | None:
        """The application if this process holds it now (never reads the database)."""
        return self._by_client_id.get(client_id) if isinstance(client_id, str) else None

    def held_origins(self) -> frozenset[str] | None:
        """Every registered origin if this process holds them now (never reads the database)."""
        return self._origins

    def origins(self, load) -> frozenset[str]:
        """Every origin some application registered, as `load()` reads them from every application
        (oauth.cors owns their normalization): read once after each change, then from memory.
        Preflights that arrive during the read wait for it rather than each reading every application."""
        origins = self._origins
        if origins is None:
            with self._origins_read:
                origins = self._origins
                if origins is None:
                    generation = self._generation
                    origins = load()
                    with self._lock:
                        if generation == self._generation:
                            self._origins = origins
        return origins

    def by_client_id(self, client_id) -> Application | None:
        """The application with this client_id (shared, read-only object), or None."""
        return self._lookup(self._by_client_id, "client_id", client_id, Application.by_client_id)

    def by_id(self, application_id) -> Application | None:
        return self._lookup(self._by_id, "id", application_id, Application.by_id)

    def _lookup(self, index: dict, name: str, key, load) -> Application | None:
        if not isinstance(key, str) or len(key) > self.MAX_KEY_LENGTH:
            return None
        app = index.get(key)
        if app is None:
            if (name, key) in self._missing:
                return None
            generation = self._generation
            app = load(key)
            if app is not None:
                self._remember(generation, app)
            else:
                self._remember_missing(generation, (name, key))
        return app
