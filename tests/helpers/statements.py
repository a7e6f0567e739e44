"""Counting the SQL statements (database round trips) a runtime runs while requests are served."""
from __future__ import annotations

import threading


class StatementCounter:
    """Counts the SQL statements the runtime's database runs (the round trips), by wrapping
    `execute_sql` on the database object itself: every Peewee query goes through it. The change
    feed's own threads (a poll every 0.5 s, off the request path) are not requests: not counted."""

    def __init__(self, db):
        self.db = db
        self.statements: list[str] = []
        self._original = db.execute_sql
        self._lock = threading.Lock()

    def __enter__(self):
        def counting(sql, params=None, *args, **kwargs):
            if not threading.current_thread().name.startswith("svc-changes"):
                with self._lock:
                    self.statements.append(sql)
            return self._original(sql, params, *args, **kwargs)
        self.db.execute_sql = counting
        return self

    def __exit__(self, *exc):
        del self.db.execute_sql

    def reset(self) -> None:
        self.statements.clear()
