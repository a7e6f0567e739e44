"""Kept-alive HTTP/1.1 connections to the clinics' EHRs, per origin: what `transport.Transport`
sends each request on (the standard library's `http.client`; the transport holds every bound).

- One process's `Connections` (`connectors.fhir.cache.FhirState`) keeps up to `per_origin` idle
  connections per (scheme, host, port), for at most `MAX_ORIGINS` origins (the least recently used
  origin's connections are closed past it). A request takes an idle one or a new, unconnected one,
  and gives it back only once its answer was read whole (`keep`); any other outcome closes it.
- An idle connection the EHR closed meanwhile (readable while idle: its FIN, or bytes nobody asked
  for) is closed when taken, never written to. One given back less than `FRESH_SECONDS` ago is
  taken without that check (a `poll`, about a tenth of a proxied read's transport CPU): EHRs keep
  idle connections for seconds, and a GET that finds one closed as it writes is sent again on a
  new connection (`transport.Transport`); a POST, never sent twice, always checks.
- HTTPS verifies the EHR's certificate and host name (`ssl.create_default_context`)."""
from __future__ import annotations

import http.client
import select
import ssl
import threading
import time

FRESH_SECONDS = 1.0              # an idle connection given back this recently is taken unchecked
MAX_ORIGINS = 16                 # origins whose idle connections are kept (past it: the least recently used closed)


class Connections:
    """Idle kept-alive connections by origin (thread-safe)."""

    def __init__(self, per_origin: int = 8, context: ssl.SSLContext | None = None, clock=time.monotonic):
        self.per_origin, self.clock = per_origin, clock
        self.context = context or ssl.create_default_context()
        self._lock = threading.Lock()
        self._idle: dict[tuple, list] = {}  # origin -> [(connection, given back at)], the last given back last;
        # origins in the order of their last use

    def take(self, origin: tuple[str, str, int], connect_timeout: float,
             check: bool = False) -> tuple[http.client.HTTPConnection, bool]:
        """(a connection to `origin`, whether it was kept from an earlier request): an idle one the
        EHR has not closed, else a new one (connected by its first request, within `connect_timeout`).
        `check`: an idle one is checked however fresh (a request that is not sent twice, a POST)."""
        while True:
            with self._lock:
                idle = self._idle.get(origin)
                connection, since = idle.pop() if idle else (None, 0.0)
            if connection is None:
                break
            if connection.sock is not None and (not check and self.clock() - since < FRESH_SECONDS
                                               or not _readable(connection.sock)):
                return connection, True
            connection.close()
        scheme, host, port = origin
        if scheme == "https":
            return http.client.HTTPSConnection(host, port, timeout=connect_timeout, context=self.context), False
        return http.client.HTTPConnection(host, port, timeout=connect_timeout), False

    def keep(self, origin: tuple[str, str, int], connection: http.client.HTTPConnection) -> None:
        """Give back a connection whose answer was read whole (closed instead when the EHR said it
        closes it, or `per_origin` are idle already)."""
        dropped = []
        with self._lock:
            idle = self._idle.pop(origin, None)
            if idle is None:
                idle = []
                while len(self._idle) >= MAX_ORIGINS:
                    dropped += [kept for kept, _ in self._idle.pop(next(iter(self._idle)))]
            self._idle[origin] = idle  # most recently used last
            if connection.sock is not None and len(idle) < self.per_origin:
                idle.append((connection, self.clock()))
            else:
                dropped.append(connection)
        for other in dropped:
            other.close()

    def close(self) -> None:
        """Close every idle connection."""
        with self._lock:
            idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection, _ in connections:
                connection.close()


def _readable(sock) -> bool:
    """Whether an idle connection's socket has something to read: the EHR closed it (or wrote out of turn)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))
