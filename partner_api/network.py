"""The REST API's region rule (spec: US-only), as an allowlist of client networks.

The client address is the connection's peer. Only when that peer is a trusted proxy
(SVC_TRUSTED_PROXIES) is `X-Forwarded-For` read, right to left, skipping trusted proxies, so a
client cannot claim an address by sending the header itself.
"""
from __future__ import annotations

import ipaddress

from oauth.errors import ApiError


def _address(text: str):
    try:
        return ipaddress.ip_address(text.strip().split("%")[0])
    except ValueError:
        return None


def _in(address, networks) -> bool:
    if address is None:
        return False
    if getattr(address, "ipv4_mapped", None):
        address = address.ipv4_mapped
    return any(address.version == net.version and address in net for net in networks)


def client_address(peer: str, forwarded_for: str | None, trusted_proxies) -> str:
    """The address the request came from, as far as we can trust the chain of proxies."""
    address = _address(peer)
    if not trusted_proxies or not _in(address, trusted_proxies) or not forwarded_for:
        return peer
    hops = [h.strip() for h in forwarded_for.split(",") if h.strip()]
    for hop in reversed(hops):
        hop_address = _address(hop)
        if hop_address is None:
            return peer  # a garbled chain: trust only what we saw ourselves
        if not _in(hop_address, trusted_proxies):
            return hop
    return hops[0] if hops else peer


def require_allowed_network(address: str, *allowlists) -> None:
    """403 `region_not_allowed` unless `address` is in every non-empty allowlist."""
    parsed = _address(address)
    for networks in allowlists:
        if networks and not _in(parsed, networks):
            raise ApiError(403, "region_not_allowed",
                           "The partner REST API is only available from allowed networks (US-hosted application "
                           "servers); this client address is not in them.")


def parse_networks(values) -> tuple:
    """An application's stored list of CIDR strings as networks (bad entries are skipped)."""
    nets = []
    for item in values or ():
        try:
            nets.append(ipaddress.ip_network(str(item), strict=False))
        except ValueError:
            continue
    return tuple(nets)
