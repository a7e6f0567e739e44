"""The client credentials grant: a partner API token bound to the application (at `/v1` only)."""
from __future__ import annotations

from models.application import Application
from models.grants import IssuedToken, expiry
from oauth.tokens import PARTNER_API_AUDIENCE


class ClientCredentialsGrant:
    grant_type = "client_credentials"

    def __init__(self, runtime):
        self.runtime = runtime

    def exchange(self, app: Application, params: dict, with_billing: bool) -> dict:
        lifetime = self.runtime.settings.client_token_ttl
        token, claims = self.runtime.tokens.access_token(
            app.id, PARTNER_API_AUDIENCE, lifetime, client_id=app.client_id, scope="partner_api")
        now = self.runtime.clock.now()
        IssuedToken.record(jti=claims["jti"], kind="client", application=app.id, issued_at=now,
                           expires_at=expiry(now, lifetime))
        return {"access_token": token, "token_type": "Bearer", "expires_in": lifetime, "scope": "partner_api"}
