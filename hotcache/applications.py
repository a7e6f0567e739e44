"""Applications (client id, secret hashes, manifest) in memory, dropped whenever any app changes.

Changes to applications are rare (registration, secret rotation, manifest edits) and each one is
announced on the `applications` topic, so dropping the whole cache then is simple and cheap. A
lookup that raced with a drop does not store what it read: it may be older than the change.
"""
from __future__ import annotations

import threading

from models.application import Application

TOPIC = "applications"


class ApplicationCache:
    def __init__(self):
        self._by_client_id: dict[str, Application] = {}
        self._by_id: dict[str, Application] = {}
        self._generation = 0
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._generation += 1
            self._by_client_id = {}
            self._by_id = {}

    def _remember(self, generation: int, app: Application) -> None:
        with self._lock:
            if generation == self._generation:
                self._by_client_id[app.client_id] = app
                self._by_id[app.id] = app

    def cached(self, client_id) -> Application | None:
        """The application if this process holds it now (never reads the database)."""
        return self._by_client_id.get(client_id) if isinstance(client_id, str) else None

    def by_client_id(self, client_id) -> Application | None:
        """The application with this client_id (shared, read-only object), or None."""
        return self._lookup(self._by_client_id, client_id, Application.by_client_id)

    def by_id(self, application_id) -> Application | None:
        return self._lookup(self._by_id, application_id, Application.by_id)

    def _lookup(self, index: dict, key, load) -> Application | None:
        if not isinstance(key, str):
            return None
        app = index.get(key)
        if app is None:
            generation = self._generation
            app = load(key)
            if app is not None:
                self._remember(generation, app)
        return app
