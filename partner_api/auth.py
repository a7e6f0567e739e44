"""Who is calling: the application a client-credentials access token was issued to."""
from __future__ import annotations

from models.application import Application
from oauth.bearer import BearerGate, confidential_client
from oauth.tokens import PARTNER_API_AUDIENCE

PARTNER_API = BearerGate(PARTNER_API_AUDIENCE, app_claim="sub", requirements=(confidential_client,),
                         missing="A Bearer access token from POST /v1/oauth/token is required.")
"""The partner API's gate: a live client-credentials token of a confidential client. Refused
alike: a token that is not ours, expired, revoked, or of another kind (a user access token or a
sandbox token carries another audience), or a public client's (it has no secret)."""


def partner_caller(runtime, authorization: str | None) -> tuple[Application, dict]:
    """(the app, the token's claims) behind `Authorization: Bearer <token>`, or 401 with `WWW-Authenticate`."""
    caller = PARTNER_API.caller(runtime, authorization)
    return caller.app, caller.claims
