"""Least-connections accept balancing for `serve --processes N`.

All processes share one listening socket (one accept queue). The supervisor creates, before the
first fork, an array in shared memory with one slot per process: the number of connections that
process has open, or ABSENT while it is not accepting (starting, draining, dead). A process
accepts one connection at a time (up to MAX_ACCEPTS per wake-up, the counts read again before
each), and only while its count is not above the smallest other count + 1; a process that is ahead stops watching the socket, so whichever is
behind takes the next connections. A burst of 32 new keep-alive connections thus ends 16/16 (±1
or 2), in every burst, instead of going to whichever process woke first (one shared socket with
Tornado's accept loop) or by a random hash (`SO_REUSEPORT`: the smaller share below 35% in 11% of
bursts of 32).

A process whose heartbeat (`ops.processes.Pulse`, in shared memory too) is older than
STALE_BEATS beat intervals (stopped, or its loop stuck) is not counted against: the others compare
themselves only with the processes that are alive, until the supervisor replaces it. (Counted, a
stopped process's connections held every other one to one connection per STALL_SECONDS.)

A paused process looks again every POLL_SECONDS (IDLE_POLL_SECONDS while nothing waits): if the
others have caught up it watches the socket again; if connections have waited for STALL_SECONDS
while the others took none (busy on CPU, or stopped), it takes one, so the backlog never waits on
a process that cannot accept.

Each process writes only its own slot (one aligned machine word), and reads the others': no lock.
"""
from __future__ import annotations

import errno
import logging
import multiprocessing
import select
import socket
import time

import tornado.httpserver
import tornado.ioloop
import tornado.iostream

from ops.idle import HeaderWaits, WatchedRequest

log = logging.getLogger("svc_auth.balance")

ABSENT = -1
STALE_BEATS = 2
"""A process whose last heartbeat is older than this many beat intervals is not counted against."""


class ConnectionCounts:
    """The shared array of open connections per process (created by the supervisor before forking)."""

    def __init__(self, processes: int):
        self.slots = multiprocessing.RawArray("q", [ABSENT] * processes)

    def set(self, index: int, value: int) -> None:
        self.slots[index] = value

    def snapshot(self) -> list[int]:
        return list(self.slots)


class Slot:
    """One process's slot in `ConnectionCounts`: its open connections, and whether it may accept."""

    def __init__(self, counts: ConnectionCounts, index: int, beats=None, beat_interval: float = 1.0):
        """`beats`: the shared array of every process's last heartbeat (`time.monotonic()`, 0 before
        its first), or None (one process: nobody else to compare with)."""
        self.counts, self.index = counts, index
        self.beats = beats
        self.stale_after = STALE_BEATS * beat_interval
        self.open = 0
        self.present = False

    def join(self) -> None:
        self.present = True
        self.counts.slots[self.index] = self.open

    def leave(self) -> None:
        self.present = False
        self.counts.slots[self.index] = ABSENT

    def opened(self) -> None:
        self.open += 1
        if self.present:
            self.counts.slots[self.index] = self.open

    def closed(self) -> None:
        self.open -= 1
        if self.present:
            self.counts.slots[self.index] = self.open

    def others(self) -> tuple[int, int]:
        """(the smallest count of the other processes that accept and beat, the sum of their
        counts); (-1, 0) when no other process does. A process whose heartbeat is stale is left out."""
        slots, beats = self.counts.slots, self.beats
        smallest, total = -1, 0
        stale_before = None
        for i in range(len(slots)):
            if i != self.index and (value := slots[i]) >= 0:
                if beats is not None and (beat := beats[i]) > 0:
                    if stale_before is None:
                        stale_before = time.monotonic() - self.stale_after
                    if beat < stale_before:
                        continue  # stopped or stuck: its connections do not hold the others back
                total += value
                if smallest < 0 or value < smallest:
                    smallest = value
        return smallest, total

    def may_accept(self) -> bool:
        smallest, _ = self.others()
        return smallest < 0 or self.open <= smallest + 1


class CountingHTTPServer(tornado.httpserver.HTTPServer):
    """An HTTPServer that counts its open connections into a `Slot` (handle_stream and on_close are
    the public hooks of TCPServer and HTTPServerConnectionDelegate), and closes the connections that
    keep it waiting for a request's headers longer than `idle_connection_timeout` seconds with one
    sweep (`ops.idle`) instead of Tornado's timer around every request."""

    def initialize(self, *args, slot: Slot, idle_connection_timeout: float = 3600,  # type: ignore[override]
                   **kwargs) -> None:
        self.slot = slot
        super().initialize(*args, idle_connection_timeout=idle_connection_timeout, **kwargs)
        # HTTPServer's parameters for each connection it serves (its public attribute): no timer of
        # Tornado's around the wait for headers; the sweep keeps the same limit.
        self.conn_params.header_timeout = None
        self.header_waits = HeaderWaits(idle_connection_timeout)
        self.header_waits.start()

    def handle_stream(self, stream, address) -> None:
        self.slot.opened()
        super().handle_stream(stream, address)

    def handle_socket(self, connection: socket.socket, address) -> None:
        """An accepted socket (from `BalancedAcceptor`), served over a NoDelayIOStream."""
        self.handle_stream(NoDelayIOStream(connection, max_buffer_size=self.max_buffer_size,
                                           read_chunk_size=self.read_chunk_size), address)

    def start_request(self, server_conn, request_conn):
        return WatchedRequest(super().start_request(server_conn, request_conn), self.header_waits, request_conn)

    def start_draining(self) -> None:
        """SIGTERM. Tornado's connection decides keep-alive when a request starts (a private flag) and
        has no public way to close once a response is sent: its keep-alive connections are served as
        before until `close_all_connections` (docs/operations.md, Shutdown)."""

    def busy(self) -> bool:
        """Only `in_flight` tells (the application's count): nothing more to wait for here."""
        return False

    async def close_all_connections(self) -> None:
        await super().close_all_connections()
        self.header_waits.stop()

    def on_close(self, server_conn) -> None:
        super().on_close(server_conn)
        self.slot.closed()
        self.on_connection_closed()

    def on_connection_closed(self) -> None:
        """Replaced by the `BalancedAcceptor` serving this server."""


class NoDelayIOStream(tornado.iostream.IOStream):
    """An IOStream with Nagle's algorithm off for the connection's whole life (TCP_NODELAY set
    once), as Node's and most servers' sockets are. Tornado's HTTP/1.1 connection turns it on to
    finish each response and off again after it (`set_nodelay`): two `setsockopt` calls per
    request, which this stream skips. A response is written out as its handler flushes it."""

    def __init__(self, socket_: socket.socket, *args, **kwargs):
        super().__init__(socket_, *args, **kwargs)
        if socket_.family in (socket.AF_INET, socket.AF_INET6):
            try:
                socket_.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass  # the peer may already have closed the connection: the stream finds out

    def set_nodelay(self, value: bool) -> None:
        """Always on (set once at the start)."""


class BalancedAcceptor:
    """Accepts connections one at a time from shared listening sockets, while the slot allows it,
    and hands each to the server's `handle_socket` (CountingHTTPServer: an IOStream under Tornado's
    HTTP1ServerConnection; ops.httpconn.HttptoolsServer: a protocol on the loop's transport)."""

    POLL_SECONDS = 0.005
    IDLE_POLL_SECONDS = 0.05
    STALL_SECONDS = 0.05
    MAX_ACCEPTS = 8

    def __init__(self, server, sockets: list[socket.socket]):
        self.server, self.sockets, self.slot = server, list(sockets), server.slot
        self.loop = tornado.ioloop.IOLoop.current()
        self.watching = False
        self.stopped = False
        self.timer = None
        self.stalled: tuple[float, int] | None = None  # (since, the others' total then)
        server.on_connection_closed = self.resume_if_allowed

    def start(self) -> None:
        for sock in self.sockets:
            sock.setblocking(False)
        self.slot.join()
        self.watch()

    def stop(self) -> None:
        """Stop accepting at once and close this process's copies of the listening sockets."""
        self.stopped = True
        self.unwatch()
        if self.timer is not None:
            self.loop.remove_timeout(self.timer)
            self.timer = None
        self.slot.leave()
        for sock in self.sockets:
            sock.close()

    def watch(self) -> None:
        if not self.watching and not self.stopped:
            self.watching = True
            self.stalled = None
            for sock in self.sockets:
                self.loop.add_handler(sock, self.on_readable, tornado.ioloop.IOLoop.READ)

    def unwatch(self) -> None:
        if self.watching:
            self.watching = False
            for sock in self.sockets:
                self.loop.remove_handler(sock)

    def on_readable(self, sock: socket.socket, events: int) -> None:
        """Accept while the slot allows it, one connection at a time (the counts are read again
        before each), up to MAX_ACCEPTS per wake-up."""
        for _ in range(self.MAX_ACCEPTS):
            if not self.slot.may_accept():
                self.pause()
                return
            if not self.accept_one(sock):
                return

    def accept_one(self, sock: socket.socket) -> bool:
        try:
            connection, address = sock.accept()
        except BlockingIOError:
            return False  # another process took it
        except OSError as exc:
            if exc.errno == errno.ECONNABORTED:
                return False
            if exc.errno in (errno.EMFILE, errno.ENFILE):  # out of descriptors: try again a little later
                log.error("cannot accept a connection: %s", exc)
                self.unwatch()
                if self.timer is None:
                    self.timer = self.loop.call_later(self.IDLE_POLL_SECONDS, self.recheck)
                return False
            raise
        connection.setblocking(False)
        self.server.handle_socket(connection, address)
        return True

    def pause(self) -> None:
        self.unwatch()
        if self.timer is None and not self.stopped:
            self.timer = self.loop.call_later(self.POLL_SECONDS, self.recheck)

    def resume_if_allowed(self) -> None:
        if not self.watching and not self.stopped and self.slot.may_accept():
            if self.timer is not None:
                self.loop.remove_timeout(self.timer)
                self.timer = None
            self.watch()

    def recheck(self) -> None:
        self.timer = None
        if self.stopped:
            return
        if self.slot.may_accept():
            self.watch()
            return
        waiting = [sock for sock in select.select(self.sockets, [], [], 0)[0]]
        if not waiting:
            self.stalled = None
            self.timer = self.loop.call_later(self.IDLE_POLL_SECONDS, self.recheck)
            return
        now, (_, others_total) = time.monotonic(), self.slot.others()
        if self.stalled is None or self.stalled[1] != others_total:
            self.stalled = (now, others_total)  # connections wait; the others may still take them
        elif now - self.stalled[0] >= self.STALL_SECONDS:
            self.accept_one(waiting[0])  # they have taken none for a while: take one
            self.stalled = None
        self.timer = self.loop.call_later(self.POLL_SECONDS, self.recheck)
