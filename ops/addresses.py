"""What a client's address is counted as, wherever counting per address limits a client: an IPv4
address as it is (an IPv4-mapped IPv6 one as its IPv4, a zone dropped), an IPv6 address by its /64,
which one host (or one customer of a provider) is routinely given whole, so counting per IPv6
address would give it 2^64 fresh counters."""
from __future__ import annotations

import ipaddress


def address_of(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`text` as an address (an IPv4-mapped IPv6 one as its IPv4, a zone dropped); None: not one."""
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped
    return address


def counted_as(text: str) -> str:
    """The key a client at `text` is counted under: its IPv4 address, its IPv6 /64; `text` itself
    when it is no address."""
    address = address_of(text)
    if address is None:
        return text
    if address.version == 6:
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)
