"""The token response of a launch: what the code exchange (`oauth.authorization_code`) and the
refresh grant (`oauth.refresh_token`) both answer, from one function, so a refreshed response
carries the same launch context and claims as the first."""
from __future__ import annotations

from oauth.claims import id_token_claims
from oauth.tokens import PLATFORM_AUDIENCE


def launch_token_response(runtime, app, user, organization_id: str, installation, scope: str, context: dict,
                          auth_time: int | None, with_billing: bool, jti: str, nonce: str | None = None,
                          fhir_user: str | None = None) -> dict:
    """`access_token` (jti `jti`), `id_token` (when `openid` is in `scope`), `token_type`,
    `expires_in`, `scope` and the launch `context` (SMART: `patient`). The access token carries the
    context, `fhirUser` (introspection answers both) and its ID token sealed (`svc_idt`). `fhirUser`
    only while `scope` has it: a refresh narrowed without it carries no `fhirUser` (and so does not
    read the user's Practitioner by it: `fhir_api.access.read_grant`)."""
    settings, tokens = runtime.settings, runtime.tokens
    if "fhirUser" not in scope.split():
        fhir_user = None
    access_claims = {"client_id": app.client_id, "org": organization_id, "scope": scope, "jti": jti, **context}
    response = {}
    if fhir_user:
        access_claims["fhirUser"] = fhir_user
    if "openid" in scope.split():
        claims = tokens.base_claims(user.id, app.client_id, settings.id_token_ttl)
        # When the user authenticated with the platform (carried from the sandbox token through
        # the launch), so every flow of one platform session carries the same auth_time.
        claims["auth_time"] = auth_time if auth_time is not None else claims["iat"]
        claims.update(id_token_claims(app, user, installation, with_billing, runtime.clock.now(), nonce))
        if fhir_user:
            claims["fhirUser"] = fhir_user
        response["id_token"] = id_token = tokens.sign(claims)
        # The ID token issued with this access token, sealed so only this service can read it:
        # the platform's verification returns it to the hub for the app's SDK (identity-provider
        # variant; hub.introspection.platform_introspection). Nothing is stored.
        access_claims["svc_idt"] = runtime.hasher.seal(id_token, jti)
    access_token, _ = tokens.access_token(user.id, PLATFORM_AUDIENCE, settings.access_token_ttl, **access_claims)
    return {"access_token": access_token, **response, "token_type": "Bearer",
            "expires_in": settings.access_token_ttl, "scope": scope, **context}
