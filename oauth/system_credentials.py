"""The client credentials grant of a backend app (SMART Backend Services): authenticated by a
client assertion (`oauth.client_assertion`), it issues a system token for the FHIR API.

`scope` is required; what is granted is `oauth.system_scopes.grant_system_scopes` (read-only,
within what the app registered; nothing grantable: 400 `invalid_scope`, and the assertion is not
spent). Then the assertion's jti is spent and the token issued: `{"access_token", "token_type":
"bearer", "expires_in" (<= 300), "scope"}`. The token (audience `fhir-system`) names the app
(`sub` and `client_id` = its client_id) and its scope, and no user or clinic: it reaches the FHIR
API of each clinic where the app is installed and Enabled (`fhir_api.system_access`). It is not
recorded; a revocation puts its jti on the deny-list (`oauth.revocation`).
"""
from __future__ import annotations

from oauth.client_assertion import AssertedClient, spend
from oauth.params import text_param
from oauth.system_scopes import MAX_SCOPE_LENGTH, grant_system_scopes
from oauth.tokens import SYSTEM_AUDIENCE

MAX_LIFETIME = 300


class SystemCredentialsGrant:
    grant_type = "client_credentials"

    def __init__(self, runtime):
        self.runtime = runtime

    def exchange(self, client: AssertedClient, params: dict) -> dict:
        app = client.app
        scope = grant_system_scopes(text_param(params, "scope", required=False, max_length=MAX_SCOPE_LENGTH),
                                    app.system_scopes)
        spend(self.runtime, client)
        lifetime = min(self.runtime.settings.access_token_ttl, MAX_LIFETIME)
        token, _ = self.runtime.tokens.access_token(app.client_id, SYSTEM_AUDIENCE, lifetime,
                                                    client_id=app.client_id, scope=scope)
        return {"access_token": token, "token_type": "bearer", "expires_in": lifetime, "scope": scope}
