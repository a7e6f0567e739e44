"""Which partner API operation allows how many requests per window (spec: Limits)."""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from dataclasses import dataclass

from conf import ConfigError


@dataclass(frozen=True)
class Limit:
    count: int
    seconds: int


DEFAULT_LIMITS: Mapping[str, Limit] = MappingProxyType({
    # The spec's Limits table.
    "invitations": Limit(10, 60),
    "organizations": Limit(10, 60),
    "users": Limit(50, 60),
    "appointments": Limit(50, 60),
    "chart_download_url": Limit(50, 60),
    # Operations the spec does not list; our choice (docs/rest-api.md explains it).
    "chart_request_create": Limit(10, 60),   # each request starts a chart build: as costly as an invitation
    "chart_request_status": Limit(50, 60),   # a poll, as cheap as the download-URL call it precedes
    "activation_status": Limit(10, 60),      # changes billing; rare by nature
    "billing": Limit(10, 60),                # a monthly report: a listing like organizations
})


def limits_from_settings(settings) -> dict[str, Limit]:
    """The defaults with `SVC_RATE_LIMITS` overrides applied; an unknown operation is a config error."""
    limits = dict(DEFAULT_LIMITS)
    for operation, count, seconds in settings.rate_limits:
        if operation not in limits:
            raise ConfigError(f"SVC_RATE_LIMITS names unknown operation {operation!r}; "
                              f"known: {', '.join(sorted(DEFAULT_LIMITS))}")
        limits[operation] = Limit(count, seconds)
    return limits
