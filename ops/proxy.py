"""Who is calling, and at which address: `X-Forwarded-*` honoured only from trusted proxies.

`SVC_TRUSTED_PROXIES` lists the networks of our reverse proxies (e.g. `127.0.0.1/32,10.0.0.0/8`).
A request whose socket peer is in them may tell us the client address (`X-Forwarded-For`, walked
from the right past every trusted hop), the scheme (`X-Forwarded-Proto`) and the host
(`X-Forwarded-Host`). From anyone else those headers are ignored, so a client cannot pretend to be
in the REST allowlist. Tokens and URLs the service hands out use SVC_ISSUER / SVC_PUBLIC_URL, not
these headers; `external_base_url` is for checking that configuration and for diagnostics.
"""
from __future__ import annotations

import functools
import ipaddress
import re

_HOST = re.compile(r"^[A-Za-z0-9.-]+(:\d{1,5})?$|^\[[0-9A-Fa-f:.]+\](:\d{1,5})?$")


def _ip(value: str):
    value = value.strip()
    if value.startswith("[") and "]" in value:  # [v6]:port
        value = value[1:value.index("]")]
    elif value.count(":") == 1:  # v4:port
        value = value.split(":", 1)[0]
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        return None


@functools.lru_cache(maxsize=1024)
def _in_networks(address: str, networks: tuple) -> bool:
    ip = _ip(address)
    if ip is not None and getattr(ip, "ipv4_mapped", None):
        ip = ip.ipv4_mapped  # ::ffff:10.0.0.2 is 10.0.0.2
    return ip is not None and any(ip in net for net in networks)


def is_trusted_proxy(address: str, settings) -> bool:
    # Cached per (peer, networks): the answer never changes, and parsing costs on every request.
    return bool(settings.trusted_proxies) and _in_networks(address or "", settings.trusted_proxies)


def _first_header_value(request, name: str) -> str | None:
    value = request.headers.get(name)
    if not value:
        return None
    return value.split(",")[0].strip() or None


def client_address(request, settings) -> str:
    """The address of the client this request comes from: the one answer that allowlists,
    throttles and the access log use."""
    peer = request.remote_ip  # the socket peer: Tornado runs with xheaders=False
    if not is_trusted_proxy(peer, settings):
        return peer
    hops = [h.strip() for h in ",".join(request.headers.get_list("X-Forwarded-For")).split(",") if h.strip()]
    for hop in reversed(hops):
        ip = _ip(hop)
        if ip is None:
            return peer  # a malformed hop: trust nothing beyond our own proxy
        if not _in_networks(str(ip), settings.trusted_proxies):
            return str(ip)
    return str(_ip(hops[0])) if hops else peer


def external_base_url(request, settings) -> str:
    """`scheme://host[:port]` the client used to reach us (through a trusted proxy, as it says)."""
    scheme, host = request.protocol, request.host
    if is_trusted_proxy(request.remote_ip, settings):
        proto = (_first_header_value(request, "X-Forwarded-Proto") or "").lower()
        if proto in ("http", "https"):
            scheme = proto
        forwarded_host = _first_header_value(request, "X-Forwarded-Host")
        if forwarded_host and _HOST.fullmatch(forwarded_host):
            host = forwarded_host
    return f"{scheme}://{host}"


WARNED_ORIGINS = 16
"""How many distinct origins `warn_if_misconfigured` logs per process: the host is the client's
choice (a proxy passes on any Host), so an unbounded set and a WARNING each would let anyone fill
memory and the log."""
_FURTHER = "\0further origins"  # the marker in `warned` that the cap was reached (no origin has a NUL)


def warn_if_misconfigured(request, settings, log, warned: set) -> None:
    """Log once per external origin (remembered in `warned`, the application's set) when a trusted
    proxy says clients reach us at an origin other than SVC_ISSUER / SVC_PUBLIC_URL: every URL we
    hand out would then point elsewhere. At most WARNED_ORIGINS origins, then one line saying
    further ones are not logged."""
    if not settings.trusted_proxies or not is_trusted_proxy(request.remote_ip, settings):
        return
    seen = external_base_url(request, settings)
    if seen in warned or seen in (settings.issuer, settings.public_url):
        return
    if len(warned) >= WARNED_ORIGINS:
        if _FURTHER not in warned:
            warned.add(_FURTHER)
            log.warning("clients reach this service at more than %d origins other than SVC_ISSUER (%s) and "
                        "SVC_PUBLIC_URL (%s); further ones are not logged", WARNED_ORIGINS, settings.issuer,
                        settings.public_url)
        return
    warned.add(seen)
    log.warning("clients reach this service at %s but SVC_ISSUER is %s and SVC_PUBLIC_URL is %s; "
                "tokens and links carry the configured addresses", seen, settings.issuer, settings.public_url,
                extra={"external_base_url": seen})
