"""Configuration of the example partner app (`PARTNER_*` environment variables)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import urlsplit


def origin_of(url: str) -> str:
    """`scheme://host[:port]` of an absolute URL."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(item.strip() for item in (value or "").split(",") if item.strip())


@dataclass(frozen=True)
class PartnerConfig:
    """What the app knows about itself and the service it is registered with."""

    auth_url: str                      # {auth_url}: the issuer; ID tokens carry iss = auth_url + "/"
    base_url: str                      # {base_url}: token, userinfo and the REST API, e.g. .../v1
    client_id: str
    client_secret: str
    public_url: str                    # where browsers reach this app, e.g. http://127.0.0.1:8889
    application_id: str = ""           # needed only for the activation REST call
    fallback_secret: str = ""          # rotation step 2: retried once when the current one gets a 4xx
    jwks_url: str = ""                 # default {auth_url}/.well-known/jwks.json
    jwks_min_refresh_seconds: float = 30.0
    allowed_origins: tuple = ()        # CORS + frame-ancestors; `https://*.example.com` allowed
    sdk_url: str = ""                  # default {origin of base_url}/static/sdk/svc-sdk.js
    authorized_users: frozenset = field(default_factory=frozenset)     # subs the app lets in
    upgraded_organizations: frozenset = field(default_factory=frozenset)  # paid after the trial
    ehr_allow: tuple = ()              # ehr_url prefixes accepted at launch (empty: any)
    ehr_deny: tuple = ()               # ehr_url prefixes refused at launch
    multi_tenant: bool = False         # redirect_uri = {public_url}/app/{svc_organization_id}
    session_ttl: int = 3600

    def __post_init__(self):
        for name in ("auth_url", "base_url", "public_url"):
            value = getattr(self, name)
            if urlsplit(value).scheme not in ("http", "https") or not urlsplit(value).netloc:
                raise ValueError(f"{name} must be an absolute http(s) URL, got {value!r}")
            object.__setattr__(self, name, value.rstrip("/"))
        if not self.client_id or not self.client_secret:
            raise ValueError("client_id and client_secret are required")
        if not self.jwks_url:
            object.__setattr__(self, "jwks_url", self.auth_url + "/.well-known/jwks.json")
        if not self.sdk_url:
            object.__setattr__(self, "sdk_url", origin_of(self.base_url) + "/static/sdk/svc-sdk.js")
        if not self.allowed_origins:
            origins = dict.fromkeys([origin_of(self.base_url), origin_of(self.auth_url)])
            object.__setattr__(self, "allowed_origins", tuple(origins))
        object.__setattr__(self, "authorized_users", frozenset(self.authorized_users))
        object.__setattr__(self, "upgraded_organizations", frozenset(self.upgraded_organizations))

    @property
    def issuer_claim(self) -> str:
        """The spec: `iss` must equal `{auth_url}/`."""
        return self.auth_url + "/"

    @property
    def redirect_base(self) -> str:
        return self.public_url + "/app"

    @property
    def platform_origins(self) -> tuple:
        """Origins allowed to frame the app and load its SDK: the service's."""
        return tuple(dict.fromkeys([origin_of(self.sdk_url), *self.allowed_origins]))

    @classmethod
    def from_env(cls, environ=None) -> "PartnerConfig":
        env = os.environ if environ is None else environ
        auth_url = env.get("PARTNER_AUTH_URL", "http://127.0.0.1:8888")
        return cls(
            auth_url=auth_url,
            base_url=env.get("PARTNER_BASE_URL", auth_url.rstrip("/") + "/v1"),
            client_id=env.get("PARTNER_CLIENT_ID", ""),
            client_secret=env.get("PARTNER_CLIENT_SECRET", ""),
            fallback_secret=env.get("PARTNER_FALLBACK_SECRET", ""),
            application_id=env.get("PARTNER_APPLICATION_ID", ""),
            public_url=env.get("PARTNER_PUBLIC_URL", "http://127.0.0.1:8889"),
            allowed_origins=_split(env.get("PARTNER_ALLOWED_ORIGINS")),
            authorized_users=frozenset(_split(env.get("PARTNER_AUTHORIZED_USERS"))),
            upgraded_organizations=frozenset(_split(env.get("PARTNER_UPGRADED_ORGANIZATIONS"))),
            ehr_allow=_split(env.get("PARTNER_EHR_ALLOW")),
            ehr_deny=_split(env.get("PARTNER_EHR_DENY")),
            multi_tenant=env.get("PARTNER_MULTI_TENANT", "") in ("1", "true", "yes"),
        )
