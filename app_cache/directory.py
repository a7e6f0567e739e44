"""The bearer gate's users in memory: each with their clinic and an application's installation there.

`user_with_installation(user_id, application_id)` answers from memory when nothing in the
directory (users, organizations, installations) has changed since the entry was read, and reads
the database otherwise. "Nothing changed" is the `directory` version (`models.changes`), which the
database itself bumps in every writer's transaction, read with the deny-list's in one query per
request (`models.changes.Versions`) instead of a three-table join and three model objects, and
still exact: a user removed, moved to another clinic, or an app's installation disabled is seen by
the very next request, in every process, whoever made the change. The version is read before the
entry is loaded, so an entry is never older than the version it is kept under. Entries are shared,
read-only objects.
"""
from __future__ import annotations

import threading

from models.application import user_with_installation
from models.changes import DIRECTORY, Versions


class DirectoryCache:
    MAX_ENTRIES = 10_000
    """Past this many (user, application) entries, all are forgotten at once."""

    def __init__(self, versions: Versions):
        self.versions = versions
        self._entries: dict[tuple[str, str], tuple[int, object]] = {}
        self._lock = threading.Lock()

    def user_with_installation(self, user_id, application_id: str):
        """`models.application.user_with_installation`, from memory while the directory is unchanged."""
        if not isinstance(user_id, str):
            return None
        version = self.versions.of(DIRECTORY)
        key = (user_id, application_id)
        entry = self._entries.get(key)
        if entry is not None and entry[0] == version:
            return entry[1]
        user = user_with_installation(user_id, application_id)
        if user is not None:
            with self._lock:
                if len(self._entries) >= self.MAX_ENTRIES:
                    self._entries = {}
                self._entries[key] = (version, user)
        return user
