"""The client credentials grant: a partner API token bound to the application (at `/v1` only).

No database work: the application comes from the in-memory cache (`app_cache`), and the token is
not recorded (a revocation would put its jti on the deny-list, `oauth.denylist`)."""
from __future__ import annotations

from models.application import Application
from oauth.errors import OAuthError
from oauth.params import text_param
from oauth.scopes import PARTNER_API_SCOPE, InvalidScope
from oauth.tokens import PARTNER_API_AUDIENCE


class ClientCredentialsGrant:
    grant_type = "client_credentials"

    def __init__(self, runtime):
        self.runtime = runtime

    def exchange(self, app: Application, params: dict, with_billing: bool) -> dict:
        if app.public:  # no secret, so nothing proves who calls: never a partner API token
            raise OAuthError("unauthorized_client", "A public client cannot use the client_credentials grant.")
        requested = text_param(params, "scope", required=False)
        if requested is not None and set(requested.split()) - {PARTNER_API_SCOPE}:
            raise InvalidScope(f"The client credentials grant grants only the {PARTNER_API_SCOPE!r} scope.")
        lifetime = self.runtime.settings.client_token_ttl
        token, claims = self.runtime.tokens.access_token(
            app.id, PARTNER_API_AUDIENCE, lifetime, client_id=app.client_id, scope=PARTNER_API_SCOPE)
        return {"access_token": token, "token_type": "Bearer", "expires_in": lifetime, "scope": PARTNER_API_SCOPE}
