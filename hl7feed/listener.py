"""`svc-auth hl7 listen`: the SIU feed's MLLP server (Tornado's TCPServer on uvloop), optionally TLS.

Each connection is read as it comes (`mllp.Deframer`); each whole message is handed to a pool
thread (`store.receive`: the database work never runs on the IOLoop) and its ACK is written on
the same connection once that returns, so `AA` always follows a commit. Messages of one
connection are taken in order, one at a time; connections are independent.

A connection is closed, with nothing stored for what it was sending, when it breaks the framing (a
byte outside `0x0B ... 0x1C 0x0D` or a 0x0B inside it, whatever follows), sends a message over 1 MiB, stays silent for
SVC_HL7_IDLE_TIMEOUT seconds, has not ended a message SVC_HL7_FRAME_TIMEOUT seconds after its first
bytes were read (however it drips), or fails its TLS handshake (a missing or foreign client
certificate with --tls-client-ca). One that leaves an ACK unread for SVC_HL7_IDLE_TIMEOUT seconds
(its socket's buffers full) is closed too: that message stays applied, and is applied once when
sent again. With --proxy-protocol (behind a TCP load balancer) a connection must come from
SVC_TRUSTED_PROXIES and begin with a PROXY header (`proxy_protocol`), read before TLS starts; the
address it names is the sender's, as `--hl7-allow` sees it.

Connections are counted by `slots.Slots`: one arriving while SVC_HL7_MAX_CONNECTIONS are open (TLS
handshakes and PROXY headers in progress included) is closed at once, so a flood cannot take every
descriptor; so is one from a peer (`ops.addresses.counted_as`: an IPv4 address, an IPv6 /64; the PROXY
header's client with --proxy-protocol, read first; else the socket's peer) that already holds
SVC_HL7_MAX_CONNECTIONS_PER_PEER, and one neither proven nor from a peer proven before while half
of SVC_HL7_MAX_CONNECTIONS are held by such connections, before any of its bytes (or its TLS
handshake) is read: senders that never get a message past the sender checks, from however many
addresses, cannot hold the slots of the clinics' interfaces. A message refused for its sender
(`Outcome.sender_passed` false: an MSH that cannot be read, an MSH-4 naming no clinic, an address
or client certificate the clinic does not take) closes its connection once its `AR` is written:
that connection would be refused again. Content that cannot be applied, whatever it holds, is
answered `AE` (or `AR`, a type not taken) by `store.receive` and the connection stays open; only
when the database fails (down, busy: `store.database_unavailable`) does the message get no ACK and
its connection close: the sender keeps it and sends it again. None of this stops the listener for
anyone else. SIGTERM stops accepting, lets messages in hand finish, then exits.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
import signal
import ssl

import uvloop
from tornado import gen
from tornado.iostream import StreamClosedError
from tornado.netutil import bind_sockets
from tornado.tcpserver import TCPServer

from hl7feed.ack import ack
from hl7feed.mllp import Deframer, FramingError, frame
from hl7feed.proxy_protocol import ProxyHeaderError, read_source
from hl7feed.slots import Slot, Slots
from hl7feed.store import prune, receive
from ops.addresses import counted_as
from ops.proxy import is_trusted_proxy

log = logging.getLogger("svc_auth.hl7")

READ_CHUNK = 64 * 1024
PRUNE_SECONDS = 3600
DRAIN_SECONDS = 30


def client_names(stream) -> tuple[str, ...]:
    """The subject CNs of the client certificate the connection's TLS handshake verified (none
    without TLS, or without --tls-client-ca: a certificate not asked for is not verified)."""
    sock = stream.socket
    if not isinstance(sock, ssl.SSLSocket):
        return ()
    cert = sock.getpeercert() or {}
    return tuple(value for rdn in cert.get("subject", ()) for key, value in rdn if key == "commonName")


def tls_context(cert: str, key: str, client_ca: str | None) -> ssl.SSLContext:
    """TLS 1.2+ with our certificate; with `client_ca`, a client certificate it signed is required.
    A file that cannot be used raises ValueError naming its option and path."""
    for option, path in (("--tls-cert", cert), ("--tls-key", key), ("--tls-client-ca", client_ca)):
        if path is not None:
            _readable(option, path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise ValueError(f"--tls-cert {cert} and --tls-key {key} are not a PEM certificate chain and its "
                         f"private key ({exc.reason or exc})") from None
    if client_ca:
        try:
            context.load_verify_locations(client_ca)
        except ssl.SSLError as exc:
            raise ValueError(f"--tls-client-ca {client_ca} holds no PEM CA certificate ({exc.reason or exc})") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _readable(option: str, path: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise ValueError(f"{option} {path}: {exc.strerror or exc}") from None


class FeedListener(TCPServer):
    """One listener process's server: its connections (`slots`), and those with a message in hand."""

    def __init__(self, runtime, ssl_options: ssl.SSLContext | None = None, proxy_protocol: bool = False):
        # Behind a balancer the PROXY header comes before the TLS handshake: TLS starts after it.
        super().__init__(ssl_options=None if proxy_protocol else ssl_options, read_chunk_size=READ_CHUNK)
        self.runtime = runtime
        self.tls = ssl_options if proxy_protocol else None
        self.proxy_protocol = proxy_protocol
        self.idle_timeout = runtime.settings.hl7_idle_timeout
        self.frame_timeout = runtime.settings.hl7_frame_timeout
        self.slots = Slots(runtime.settings.hl7_max_connections, runtime.settings.hl7_max_connections_per_peer)
        self.streams: set = set()
        self.busy: set = set()
        self.stopping = False

    async def handle_stream(self, stream, address) -> None:
        peer = address[0] if isinstance(address, tuple) else ""
        if self.proxy_protocol:
            if self._over_cap(stream, peer, None):
                return
            opened = await self._through_balancer(stream, peer)
            if opened is None:
                return
            stream, peer, slot = opened
        else:
            slot = self._admit(stream, peer)
            if slot is None:
                return
        self.streams.add(stream)
        try:
            await self._serve_connection(stream, peer, slot)
        finally:
            self.streams.discard(stream)
            self.slots.release(slot)
            stream.close()

    async def _serve_connection(self, stream, peer: str, slot: Slot) -> None:
        """Read, apply and acknowledge the connection's messages until it ends (see the module)."""
        deframer = Deframer()
        loop = asyncio.get_running_loop()
        frame_ends = None  # while a message is incomplete: when it must have ended
        names = None  # the client certificate's subject CNs, once the handshake is done
        try:
            while not self.stopping:
                wait = self.idle_timeout if frame_ends is None else min(self.idle_timeout, frame_ends - loop.time())
                try:
                    data = await gen.with_timeout(dt.timedelta(seconds=max(wait, 0.0)),
                                                  stream.read_bytes(READ_CHUNK, partial=True),
                                                  quiet_exceptions=(StreamClosedError,))
                except gen.TimeoutError:
                    if frame_ends is not None and wait < self.idle_timeout:
                        log.info("hl7: %s did not end its message within %ss: closed (nothing stored)", peer,
                                 self.frame_timeout)
                    else:
                        log.info("hl7: %s silent for %ss: closed%s", peer, self.idle_timeout,
                                 "" if deframer.idle else " in the middle of a message (nothing stored)")
                    return
                messages = deframer.feed(data)
                for message in messages:
                    names = client_names(stream) if names is None else names
                    if not await self._answer(stream, peer, slot, message, names):
                        return
                deframer.check()   # bytes outside the framing after those whole messages: closed now
                if deframer.idle:
                    frame_ends = None
                elif frame_ends is None or messages:  # a message began (in this read if one ended in it):
                    frame_ends = loop.time() + self.frame_timeout   # it has SVC_HL7_FRAME_TIMEOUT to end
        except FramingError as exc:
            log.warning("hl7: %s: %s; connection closed, nothing stored", peer, exc)
        except StreamClosedError:
            pass
        except Exception:  # noqa: BLE001  (the database failed: no ACK, the sender sends it again)
            log.exception("hl7: a message from %s could not be stored; closed without an ACK", peer)

    async def _answer(self, stream, peer: str, slot: Slot, message: bytes, names: tuple[str, ...]) -> bool:
        """Apply one message and write its ACK; False: the connection is to be closed (an ACK left
        unread, or a message refused for its sender: the connection would be refused again)."""
        self.busy.add(stream)
        try:
            outcome = await self.runtime.run(receive, self.runtime, message, peer, names)
        finally:
            self.busy.discard(stream)
        if outcome.sender_passed:
            self.slots.prove(slot)
        reply = frame(ack(outcome.ack, outcome.header, self.runtime.clock.now(), outcome.text, outcome.where,
                          outcome.code))
        try:  # a peer that never reads its ACKs must not hold the connection for ever
            await gen.with_timeout(dt.timedelta(seconds=self.idle_timeout), stream.write(reply),
                                   quiet_exceptions=(StreamClosedError,))
        except gen.TimeoutError:
            log.info("hl7: %s did not read its ACK within %ss: closed", peer, self.idle_timeout)
            return False
        if not outcome.sender_passed:
            log.info("hl7: %s: AR %s for its sender: closed", peer, outcome.code)
            return False
        return True

    def _over_cap(self, stream, peer: str, key: str | None) -> bool:
        """One more connection from `key` (None: not known yet) is over a cap: closed at once, logged."""
        reason = self.slots.refusal(key)
        if reason is not None:
            log.warning("hl7: %s: %s: closed at once", peer, reason)
            stream.close()
        return reason is not None

    def _admit(self, stream, peer: str) -> Slot | None:
        """The connection counted for its peer (released with `Slots.release`), or None: closed at once."""
        key = counted_as(peer)
        return None if self._over_cap(stream, peer, key) else self.slots.take(key)

    async def _through_balancer(self, stream, balancer: str):
        """The PROXY header (only from SVC_TRUSTED_PROXIES), the client's caps (`_admit`), then TLS
        if configured: (stream, the client's address, its slot), or None with the connection closed
        (and not counted)."""
        if not is_trusted_proxy(balancer, self.runtime.settings):
            log.warning("hl7: %s is not in SVC_TRUSTED_PROXIES (--proxy-protocol): closed", balancer)
            stream.close()
            return None
        self.slots.unknown += 1
        try:
            client = await read_source(stream.socket, self.frame_timeout)
        except (ProxyHeaderError, TimeoutError, OSError) as exc:
            log.warning("hl7: %s: %s; closed, nothing read", balancer,
                        exc if isinstance(exc, ProxyHeaderError) else "no PROXY header in time")
            stream.close()
            return None
        finally:
            self.slots.unknown -= 1
        peer = client or balancer
        slot = self._admit(stream, peer)  # before the TLS handshake: nothing more is read
        if slot is None:
            return None
        if self.tls is not None:
            try:  # a failed or cancelled handshake closes its socket (Tornado >= 6.6)
                stream = await asyncio.wait_for(stream.start_tls(server_side=True, ssl_options=self.tls),
                                                self.idle_timeout)
            except (TimeoutError, OSError, StreamClosedError):
                log.info("hl7: %s (via %s): no TLS handshake; closed, nothing read", peer, balancer)
                self.slots.release(slot)
                return None
            except BaseException:  # cancelled: the connection is not counted any more
                self.slots.release(slot)
                raise
        return stream, peer, slot

    async def drain(self) -> None:
        """Stop: idle connections close now; those with a message in hand once its ACK is written."""
        self.stopping = True
        self.stop()
        for stream in list(self.streams - self.busy):
            stream.close()
        deadline = asyncio.get_running_loop().time() + DRAIN_SECONDS
        while self.busy and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        for stream in list(self.streams):
            stream.close()


async def _prune_now(runtime) -> None:
    try:
        removed = await runtime.run(prune, runtime, runtime.clock.now())
        if any(removed):
            log.info("hl7: retention removed %d past appointments and %d old message records", *removed)
    except Exception:  # noqa: BLE001
        log.exception("hl7: retention sweep failed; next one in %ss", PRUNE_SECONDS)


async def _serve(runtime, host: str, port: int, context: ssl.SSLContext | None, proxy_protocol: bool) -> None:
    listener = FeedListener(runtime, context, proxy_protocol)
    sockets = bind_sockets(port, host)
    listener.add_sockets(sockets)
    port = sockets[0].getsockname()[1]  # `--port 0`: the one the system chose, as logged below
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("hl7 listener on %s:%d (%s%s)", host, port,
             "TLS" + (", client certificates required" if context and context.verify_mode == ssl.CERT_REQUIRED else "")
             if context else "plain MLLP", ", behind a balancer: PROXY headers from SVC_TRUSTED_PROXIES"
             if proxy_protocol else "")
    while not stop.is_set():
        await _prune_now(runtime)
        try:
            await asyncio.wait_for(stop.wait(), PRUNE_SECONDS)
        except asyncio.TimeoutError:
            pass
    log.info("hl7 listener stopping: finishing the messages in hand")
    await listener.drain()


def serve_forever(runtime, host: str, port: int, context: ssl.SSLContext | None, proxy_protocol: bool = False) -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_serve(runtime, host, port, context, proxy_protocol))
