"""Connections that keep the server waiting for a request's headers, closed by one sweep.

Tornado's HTTP/1.1 server bounds the wait for each request's headers (`idle_connection_timeout`,
an hour by default) with a timer made and cancelled around every request (`gen.with_timeout`):
about 7% of a `/healthz`'s CPU. `HeaderWaits` keeps the same rule without a timer per request:
the server notes when each request's wait for its headers begins and ends (`WatchedRequest`),
and a sweep every `sweep_seconds` closes each connection that has waited longer than the limit,
as Tornado's timeout did (the connection closed, nothing answered). A request whose headers have
come is never swept: its handler, its body and its response have no time limit here, as before.
"""
from __future__ import annotations

import time

import tornado.httputil
import tornado.ioloop

SWEEPS_PER_LIMIT = 10
"""A connection is closed between the limit and the limit plus a tenth of it (at most a minute)."""


class HeaderWaits:
    """The requests waiting for their headers (HTTP1Connection → when the wait began), and the
    sweep that closes those past `limit` seconds. Owned by one server, used on its IOLoop only."""

    def __init__(self, limit: float, clock=time.monotonic):
        self.limit = float(limit)
        self.clock = clock
        self.since: dict = {}
        self.sweeper: tornado.ioloop.PeriodicCallback | None = None

    @property
    def sweep_seconds(self) -> float:
        return max(0.05, min(60.0, self.limit / SWEEPS_PER_LIMIT))

    def sweep(self) -> int:
        """Close every connection that has waited for headers longer than the limit; how many."""
        cutoff = self.clock() - self.limit
        stale = [conn for conn, since in self.since.items() if since < cutoff]
        for conn in stale:
            del self.since[conn]
            conn.close()  # HTTP1Connection.close: the read of the headers ends, and the connection with it
        return len(stale)

    def start(self) -> None:
        """Sweep on the current IOLoop until `stop`."""
        if self.sweeper is None:
            self.sweeper = tornado.ioloop.PeriodicCallback(self.sweep, self.sweep_seconds * 1000)
            self.sweeper.start()

    def stop(self) -> None:
        if self.sweeper is not None:
            self.sweeper.stop()
            self.sweeper = None


class WatchedRequest(tornado.httputil.HTTPMessageDelegate):
    """A request's delegate, wrapped: its wait for headers ends when they come, or when the
    connection closes first."""

    __slots__ = ("delegate", "waiting", "connection")

    def __init__(self, delegate, waits: HeaderWaits, connection):
        self.delegate, self.waiting, self.connection = delegate, waits.since, connection
        self.waiting[connection] = waits.clock()

    def headers_received(self, start_line, headers):
        self.waiting.pop(self.connection, None)
        return self.delegate.headers_received(start_line, headers)

    def data_received(self, chunk):
        return self.delegate.data_received(chunk)

    def finish(self):
        return self.delegate.finish()

    def on_connection_close(self):
        self.waiting.pop(self.connection, None)
        return self.delegate.on_connection_close()
