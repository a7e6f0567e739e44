"""The authorization code grant: the authorize step (launch -> code) and the code exchange."""
from __future__ import annotations

from models.application import Application
from models.grants import AuthorizationCode, IssuedToken, Launch, expiry
from models.ids import new_secret
from oauth.claims import id_token_claims
from oauth.errors import AuthorizeError, invalid_grant
from oauth.params import text_param
from oauth.redirects import redirect_uri_allowed, with_query
from oauth.tokens import PLATFORM_AUDIENCE


def _query_value(params: dict, name: str) -> str | None:
    value = params.get(name)
    return value if isinstance(value, str) and value else None


class AuthorizationRequest:
    """`GET /oauth/authorize`: turns a valid launch into a one-time code for the client."""

    def __init__(self, runtime):
        self.runtime = runtime

    def client_and_redirect(self, params: dict) -> tuple[Application, str]:
        """Errors here are shown, never redirected: the client or its redirect_uri is untrusted."""
        client_id = _query_value(params, "client_id")
        if client_id is None:
            raise AuthorizeError("invalid_request", "The client_id parameter is required.")
        app = Application.by_client_id(client_id)
        if app is None:
            raise AuthorizeError("invalid_client", "Unknown client_id.")
        redirect_uri = _query_value(params, "redirect_uri")
        if redirect_uri is None:
            raise AuthorizeError("invalid_request", "The redirect_uri parameter is required.")
        if not redirect_uri_allowed(redirect_uri, app.redirect_uri):
            raise AuthorizeError("invalid_request", "redirect_uri does not match the application manifest.")
        return app, redirect_uri

    def issue_code(self, params: dict) -> str:
        """The URL to redirect to: redirect_uri with `code` (and `state`), or with an error."""
        app, redirect_uri = self.client_and_redirect(params)
        state = _query_value(params, "state")

        def fail(error: str, description: str):
            return AuthorizeError(error, description, redirect_uri=redirect_uri, state=state)

        response_type = _query_value(params, "response_type")
        if response_type is None:
            raise fail("invalid_request", "The response_type parameter is required.")
        if response_type != "code":
            raise fail("unsupported_response_type", "Only response_type=code is supported.")
        launch_id = _query_value(params, "launch_id") or _query_value(params, "login_hint")
        if launch_id is None:
            raise fail("invalid_request", "The launch_id parameter is required.")
        launch = Launch.get_or_none((Launch.id == launch_id) & (Launch.application == app.id))
        now = self.runtime.clock.now()
        if launch is None or not launch.consume(now):
            raise fail("invalid_request", "The launch is unknown, expired, already used or issued for another client.")
        code = new_secret(32)
        AuthorizationCode.create(
            code_hash=self.runtime.hasher.digest(code), application=app.id, user=launch.user_id,
            organization=launch.organization_id, launch=launch.id, redirect_uri=redirect_uri,
            nonce=_query_value(params, "nonce"), created_at=now,
            expires_at=expiry(now, self.runtime.settings.code_ttl))
        return with_query(redirect_uri, code=code, state=state)


class AuthorizationCodeGrant:
    """`grant_type=authorization_code`: a single-use code for an access token and an ID token."""

    grant_type = "authorization_code"

    def __init__(self, runtime):
        self.runtime = runtime

    def exchange(self, app: Application, params: dict, with_billing: bool) -> dict:
        code = text_param(params, "code")
        redirect_uri = text_param(params, "redirect_uri", required=False)
        code_hash = self.runtime.hasher.digest(code)
        grant = AuthorizationCode.find_for_exchange(code_hash)
        if grant is None or grant.application_id != app.id:
            raise invalid_grant("The authorization code is invalid.")
        now = self.runtime.clock.now()
        if grant.used_at is not None or not grant.consume(now):
            # RFC 6749 4.1.2: a replayed code revokes what its first use issued.
            IssuedToken.revoke_from_code(code_hash, now)
            raise invalid_grant("The authorization code was already used; tokens issued from it are revoked.")
        if grant.expired(now):
            raise invalid_grant("The authorization code has expired.")
        if redirect_uri is not None and redirect_uri != grant.redirect_uri:
            raise invalid_grant("redirect_uri does not match the one the code was issued for.")
        return self.tokens_for(app, grant, with_billing)

    def tokens_for(self, app: Application, grant: AuthorizationCode, with_billing: bool) -> dict:
        settings, tokens = self.runtime.settings, self.runtime.tokens
        now = self.runtime.clock.now()
        user = grant.user
        access_token, access = tokens.access_token(
            user.id, PLATFORM_AUDIENCE, settings.access_token_ttl,
            client_id=app.client_id, org=grant.organization_id, scope="openid")
        IssuedToken.record(jti=access["jti"], kind="access", application=app.id, user=user.id,
                           code_hash=grant.code_hash, issued_at=now,
                           expires_at=expiry(now, settings.access_token_ttl))
        installation = grant.installation  # read with the code (same app and organization)
        claims = tokens.base_claims(user.id, app.client_id, settings.id_token_ttl)
        claims["auth_time"] = claims["iat"]
        claims.update(id_token_claims(app, user, installation, with_billing, now, grant.nonce))
        return {"access_token": access_token, "id_token": tokens.sign(claims), "token_type": "Bearer",
                "expires_in": settings.access_token_ttl, "scope": "openid"}
