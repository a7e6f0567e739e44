"""The REST API's region rule (spec: US-only), as an allowlist of client networks.

The address checked is the one client address of a request (`ops.proxy.client_address`: the
connection's peer, or `X-Forwarded-For` read right to left past SVC_TRUSTED_PROXIES only), so a
client cannot claim an address by sending the header itself.
"""
from __future__ import annotations

import ipaddress

from errors import ApiError


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


def require_allowed_network(address: str, *allowlists) -> None:
    """403 `region_not_allowed` unless `address` is in every non-empty allowlist."""
    parsed = _address(address)
    for networks in allowlists:
        if networks and not _in(parsed, networks):
            raise ApiError(403, "region_not_allowed",
                           "The partner REST API is only available from allowed networks (US-hosted application "
                           "servers); this client address is not in them.")


class _Unreadable:
    """A stored entry that is not a network (only an edit of the database makes one): it matches no
    address, so an allowlist holding it still refuses everything outside its readable networks."""
    version = None


def parse_networks(values) -> tuple:
    """An application's stored list of CIDR strings as networks. An unreadable entry fails closed:
    it stays in the list and matches nothing, so a list that is all unreadable allows no address
    (skipping it would have turned that list into "any network")."""
    nets = []
    for item in values or ():
        try:
            nets.append(ipaddress.ip_network(str(item), strict=False))
        except ValueError:
            nets.append(_Unreadable())
    return tuple(nets)
