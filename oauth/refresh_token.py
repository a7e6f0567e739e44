"""The refresh token grant (RFC 6749 6; SMART App Launch 2.2 "Refresh access token"): a SMART
app's refresh token for a new access token with the same launch context, and the next refresh token.

The client authenticates at the token endpoint as for a code (a public client names itself with
`client_id`); the token must be its own. `scope` may narrow the access token's scope, never widen
it; the grant keeps its scope for later refreshes (RFC 6749 6). The answer is the launch's token
response (`oauth.launch_tokens`): `patient`, a new ID token with `fhirUser` when `openid` is in the
scope, and a new `refresh_token` (rotation; `oauth.smart_grants`)."""
from __future__ import annotations

from errors import ApiError
from models.application import Application, Installation
from models.ids import new_secret
from oauth.errors import invalid_grant
from oauth.launch_tokens import launch_token_response
from oauth.params import text_param
from oauth.smart_grants import grant_user, rotate


class RefreshTokenGrant:
    grant_type = "refresh_token"

    def __init__(self, runtime):
        self.runtime = runtime

    def exchange(self, app: Application, params: dict, with_billing: bool) -> dict:
        runtime = self.runtime
        token = text_param(params, "refresh_token", max_length=8000)  # any token-shaped value: invalid_grant
        requested = text_param(params, "scope", required=False)
        jti = new_secret(16)
        grant, refresh_token, scope = rotate(runtime, app, token, requested, jti)
        user = grant_user(grant)
        if user is None or user.organization_id != grant.organization_id:
            raise invalid_grant("The grant's user is no longer in its clinic.")
        installation = Installation.find(app.id, grant.organization_id)
        try:  # the installation still allows use: `lifecycle.activation`
            runtime.activation.require(installation, runtime.activation.USE)
        except ApiError as exc:
            raise invalid_grant(f"The grant has ended: {exc.message}") from None
        context = {k: v for k, v in grant.context.items() if k != "fhirUser"}
        response = launch_token_response(runtime, app, user, grant.organization_id, installation, scope, context,
                                         grant.auth_time, with_billing, jti, fhir_user=grant.context.get("fhirUser"))
        response["refresh_token"] = refresh_token
        return response
