"""Change notification across processes and hosts: "topic X changed, drop what you cached".

`announce(topic)` bumps the topic's row in `change_version` (every backend, so a change is never
lost), publishes the topic on Redis when SVC_REDIS_URL is set (other processes hear it at once),
and runs this process's listeners. `start()` (serve processes) runs a thread that polls the version
rows every `POLL_SECONDS` and, with Redis, a thread subscribed to the channel. A listener that fails
(the database is down) is retried at the next poll, because the topic's version is remembered only
after its listeners succeeded. Nothing here runs on the request path.
"""
from __future__ import annotations

import logging
import os
import threading
from collections import defaultdict

import peewee

from models.changes import ChangeVersion
from models.db import DATABASE_ERRORS, discard, release  # the same unit-of-work rules as requests

log = logging.getLogger("svc_auth.changes")

POLL_SECONDS = 0.5


class ChangeFeed:
    def __init__(self, db: peewee.Database, redis_url: str = "", namespace: str = "svc-auth",
                 poll_seconds: float = POLL_SECONDS):
        self.db = db
        self.redis_url = redis_url
        self.channel = f"{namespace}:changes"
        self.poll_seconds = poll_seconds
        self._listeners: dict[str, list] = defaultdict(list)
        self._seen: dict[str, int] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._origin = f"{os.getpid()}-{id(self)}"
        self._publisher = None

    def subscribe(self, topic: str, listener) -> None:
        """Call `listener()` whenever `topic` changes (in this process or any other)."""
        self._listeners[topic].append(listener)

    # -- announcing ----------------------------------------------------------------------------
    def announce(self, topic: str) -> None:
        """Tell every process that `topic` changed. Inside a transaction only the version row is
        bumped (it commits with the change) and this process drops its copy; every process's poll
        then hears it after the commit, so none can re-read the old state and keep it."""
        table = '"change_version"'
        p = self.db.param
        version = self.db.execute_sql(
            f"INSERT INTO {table} (topic, version) VALUES ({p}, 1) "
            f"ON CONFLICT (topic) DO UPDATE SET version = {table}.version + 1 RETURNING version",
            (topic,)).fetchone()[0]
        if self.db.in_transaction():
            self._notify(topic)
            return
        if self.redis_url:
            try:
                self._redis().publish(self.channel, f"{self._origin} {topic} {version}")
            except Exception as exc:  # the version row still carries it, within one poll
                log.warning("could not publish %s change on Redis: %s", topic, exc)
        self._heard(topic, version)

    def _heard(self, topic: str, version: int) -> None:
        if self._notify(topic):
            self._seen[topic] = max(version, self._seen.get(topic, 0))

    def _redis(self):
        if self._publisher is None:
            import redis
            self._publisher = redis.Redis.from_url(self.redis_url, socket_timeout=1.0, socket_connect_timeout=1.0)
        return self._publisher

    def _notify(self, topic: str) -> bool:
        ok = True
        for listener in list(self._listeners.get(topic, ())):
            try:
                listener()
            except Exception as exc:
                ok = False
                if isinstance(exc, DATABASE_ERRORS):
                    discard(self.db)
                log.warning("refreshing %s after a change failed (retried at the next poll): %s", topic, exc)
        return ok

    # -- watching ------------------------------------------------------------------------------
    def versions(self) -> dict[str, int]:
        return {row.topic: row.version for row in ChangeVersion.select(ChangeVersion.topic, ChangeVersion.version)}

    def poll(self) -> list[str]:
        """Run the listeners of every topic whose version moved since the last poll."""
        changed = []
        for topic, version in self.versions().items():
            if version > self._seen.get(topic, 0):
                changed.append(topic)
                self._heard(topic, version)
        return changed

    def start(self) -> None:
        if self._threads:
            return
        self._stop.clear()
        self._spawn(self._poll_loop, "svc-changes-poll")
        if self.redis_url:
            self._spawn(self._listen_loop, "svc-changes-redis")

    def _spawn(self, target, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _poll_loop(self) -> None:
        # The first poll refreshes every topic once: whatever was loaded before it may be older.
        while not self._stop.wait(self.poll_seconds):
            try:
                self.poll()
            except DATABASE_ERRORS as exc:  # database away: keep serving from memory, try again
                discard(self.db)
                log.debug("change poll failed: %s", exc)
            except Exception as exc:
                log.warning("change poll failed: %s", exc)
            finally:
                release(self.db)  # the pooled connection goes back between polls

    def _listen_loop(self) -> None:
        import redis
        while not self._stop.is_set():
            client = None
            try:
                client = redis.Redis.from_url(self.redis_url, socket_connect_timeout=1.0, socket_timeout=None,
                                              health_check_interval=10)
                pubsub = client.pubsub(ignore_subscribe_messages=False)
                pubsub.subscribe(self.channel)
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=0.5)
                    if message is None:
                        continue
                    if message["type"] == "subscribe":
                        # (Re)subscribed: anything published while we were away is caught by the
                        # next poll of the version rows.
                        continue
                    if message["type"] != "message":
                        continue
                    origin, topic, version = message["data"].decode().split(" ")
                    if origin != self._origin:
                        try:
                            self._heard(topic, int(version))
                        finally:
                            release(self.db)
            except Exception as exc:
                log.debug("change listener: %s; reconnecting", exc)
                self._stop.wait(0.5)
            finally:
                if client is not None:
                    client.close()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=2)
        self._threads = []
        if self._publisher is not None:
            self._publisher.close()
            self._publisher = None
