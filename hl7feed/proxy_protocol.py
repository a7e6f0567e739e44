"""The PROXY protocol (HAProxy's, versions 1 and 2): the client address a TCP load balancer saw.

Behind a TCP load balancer every connection comes from the balancer, so a clinic's `--hl7-allow`
would see the balancer's address. With `hl7 listen --proxy-protocol` the balancer (HAProxy
`send-proxy`/`send-proxy-v2`, AWS NLB, nginx `proxy_protocol on`) writes one header before the
connection's first byte, and the listener takes the client address from it. Only a connection from
`SVC_TRUSTED_PROXIES` may carry one (the listener closes any other), or anyone reaching the port
could name any address.

The header is read straight off the socket, exactly its own bytes (v2 says its length; v1 is read
up to its CRLF, at most 107 bytes), so the TLS handshake or MLLP that follows is untouched.
Spec: https://www.haproxy.org/download/2.6/doc/proxy-protocol.txt
"""
from __future__ import annotations

import asyncio
import ipaddress
import struct
from types import MappingProxyType

V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V1_MAX = 107               # the spec's longest v1 line, CRLF included
V2_MAX_BODY = 4096         # addresses and TLVs; real balancers send well under 600 bytes
_V2_FAMILIES = MappingProxyType({0x11: (4, 12), 0x21: (16, 36)})   # TCP over IPv4 / IPv6: address, block size


class ProxyHeaderError(ValueError):
    """The connection did not begin with a well-formed PROXY header."""


async def read_source(sock, timeout: float) -> str | None:
    """Consume the PROXY header at the start of `sock` (non-blocking, nothing read from it yet) and
    return the client address it names; None when the balancer speaks for itself (v1 `UNKNOWN`,
    v2 `LOCAL` or a non-IP family): the connection's own peer then stands."""
    async with asyncio.timeout(timeout):
        head = await _exactly(sock, 12)
        if head == V2_SIGNATURE:
            rest = await _exactly(sock, 4)
            (length,) = struct.unpack("!H", rest[2:4])
            if length > V2_MAX_BODY:
                raise ProxyHeaderError(f"a v2 header of {length} bytes")
            return parse_v2(rest[0], rest[1], await _exactly(sock, length))
        if not head.startswith(b"PROXY "):
            raise ProxyHeaderError("no PROXY header")
        line = head
        while not line.endswith(b"\r\n"):
            if len(line) >= V1_MAX:
                raise ProxyHeaderError("a v1 header longer than 107 bytes")
            line += await _exactly(sock, 1)
        return parse_v1(line)


def parse_v1(line: bytes) -> str | None:
    """`PROXY TCP4|TCP6 src dst sport dport\\r\\n`, or `PROXY UNKNOWN ...\\r\\n`."""
    try:
        words = line[:-2].decode("ascii").split(" ")
    except UnicodeDecodeError:
        raise ProxyHeaderError("a v1 header that is not ASCII") from None
    if words[:2] == ["PROXY", "UNKNOWN"]:
        return None
    if len(words) != 6 or words[1] not in ("TCP4", "TCP6"):
        raise ProxyHeaderError("a malformed v1 header")
    version = 4 if words[1] == "TCP4" else 6
    source = _address(words[2], version)
    _address(words[3], version)
    for port in words[4:]:
        if not (port.isascii() and port.isdigit() and len(port) <= 5 and int(port) < 65536):
            raise ProxyHeaderError("a malformed port in a v1 header")
    return source


def parse_v2(version_command: int, family: int, body: bytes) -> str | None:
    """The binary header after its signature: version 2, LOCAL or PROXY, the family, the addresses."""
    if version_command >> 4 != 2 or version_command & 0x0F not in (0, 1):
        raise ProxyHeaderError("a v2 header of an unknown version or command")
    if version_command & 0x0F == 0 or family not in _V2_FAMILIES:  # LOCAL, UNSPEC, UNIX: no client address
        if family >> 4 > 3 or family & 0x0F > 2:
            raise ProxyHeaderError("a v2 header of an unknown family")
        return None
    size, block = _V2_FAMILIES[family]
    if len(body) < block:
        raise ProxyHeaderError("a v2 header shorter than its addresses")
    return str(ipaddress.ip_address(body[:size]))


def _address(text: str, version: int) -> str:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        raise ProxyHeaderError("a malformed address in a v1 header") from None
    if address.version != version:
        raise ProxyHeaderError("an address of the wrong family in a v1 header")
    return str(address)


async def _exactly(sock, count: int) -> bytes:
    loop = asyncio.get_running_loop()
    data = b""
    while len(data) < count:
        chunk = await loop.sock_recv(sock, count - len(data))
        if not chunk:
            raise ProxyHeaderError("closed before the PROXY header ended")
        data += chunk
    return data
