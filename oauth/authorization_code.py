"""The authorization code grant: the authorize step (launch -> code) and the code exchange."""
from __future__ import annotations

import datetime as dt

from models.application import Application
from models.grants import AuthorizationCode, IssuedToken, Launch, expiry
from models.ids import new_secret
from oauth.claims import id_token_claims
from oauth.errors import AuthorizeError, invalid_grant
from oauth.params import text_param
from oauth.redirects import redirect_uri_allowed, with_query
from oauth.scopes import InvalidScope, granted_scope
from oauth.tokens import PLATFORM_AUDIENCE

# OIDC Core 3.1.2.1 prompt values. There is no interactive login (the platform authenticated
# the user before the launch), so `login` cannot be honoured and is answered login_required.
PROMPT_VALUES = {"none", "login", "consent", "select_account"}


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
        """The URL to redirect to: redirect_uri with `code`, `state` and `iss` (RFC 9207).
        Errors after the client and redirect_uri are trusted raise AuthorizeError with a
        redirect_uri: `error_location` turns them into the redirect."""
        app, redirect_uri = self.client_and_redirect(params)
        state = _query_value(params, "state")

        def fail(error: str, description: str):
            return AuthorizeError(error, description, redirect_uri=redirect_uri, state=state)

        # Before the other checks: with a request object the other parameters may be inside it.
        if "request" in params:
            raise fail("request_not_supported", "Request objects (the request parameter) are not supported.")
        if "request_uri" in params:
            raise fail("request_uri_not_supported", "The request_uri parameter is not supported.")
        response_type = _query_value(params, "response_type")
        if response_type is None:
            raise fail("invalid_request", "The response_type parameter is required.")
        if response_type != "code":
            raise fail("unsupported_response_type", "Only response_type=code is supported.")
        try:
            scope = granted_scope(_query_value(params, "scope"))
        except InvalidScope as exc:
            raise fail("invalid_scope", exc.message) from None
        prompt = set((_query_value(params, "prompt") or "").split())
        if prompt - PROMPT_VALUES or ("none" in prompt and len(prompt) > 1):
            raise fail("invalid_request", "prompt must be none, or any of login, consent, select_account.")
        max_age = _query_value(params, "max_age")
        if max_age is not None:
            if not max_age.isdigit() or len(max_age) > 10:
                raise fail("invalid_request", "max_age must be a whole number of seconds.")
            max_age = int(max_age)
        if "login" in prompt:
            raise fail("login_required", "This server has no interactive login: the platform signs the user in "
                                         "before it creates a launch.")
        # Without a usable launch no user is signed in: with prompt=none that is login_required
        # (OIDC Core 3.1.2.6), otherwise a malformed request.
        missing = "login_required" if "none" in prompt else "invalid_request"
        launch_id = _query_value(params, "launch_id") or _query_value(params, "login_hint")
        if launch_id is None:
            raise fail(missing, "The launch_id parameter is required: open the app from the platform.")
        launch = Launch.get_or_none((Launch.id == launch_id) & (Launch.application == app.id))
        now = self.runtime.clock.now()
        if launch is None or launch.used_at is not None or launch.expires_at <= now:
            raise fail(missing, "The launch is unknown, expired, already used or issued for another client.")
        auth_time = launch.auth_time
        if auth_time is None:  # a launch created before auth_time was recorded
            auth_time = int(launch.created_at.replace(tzinfo=dt.timezone.utc).timestamp())
        if max_age is not None and self.runtime.clock.time() - auth_time > max_age:
            # The launch stays unused: a fresher platform sign-in can still open the app.
            raise fail("login_required", "The user authenticated with the platform longer ago than max_age.")
        if not launch.consume(now):
            raise fail(missing, "The launch is unknown, expired, already used or issued for another client.")
        code = new_secret(32)
        AuthorizationCode.create(
            code_hash=self.runtime.hasher.digest(code), application=app.id, user=launch.user_id,
            organization=launch.organization_id, launch=launch.id, redirect_uri=redirect_uri,
            nonce=_query_value(params, "nonce"), created_at=now,
            expires_at=expiry(now, self.runtime.settings.code_ttl), auth_time=auth_time, scope=scope)
        return with_query(redirect_uri, code=code, state=state, iss=self.runtime.settings.issuer_claim)

    def error_location(self, err: AuthorizeError) -> str:
        """RFC 6749 4.1.2.1 error redirect, with `iss` (RFC 9207) like every authorization response."""
        return with_query(err.redirect_uri, error=err.error, error_description=err.description, state=err.state,
                          iss=self.runtime.settings.issuer_claim)


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
        scope = grant.scope or "openid"
        access_token, access = tokens.access_token(
            user.id, PLATFORM_AUDIENCE, settings.access_token_ttl,
            client_id=app.client_id, org=grant.organization_id, scope=scope)
        IssuedToken.record(jti=access["jti"], kind="access", application=app.id, user=user.id,
                           code_hash=grant.code_hash, issued_at=now,
                           expires_at=expiry(now, settings.access_token_ttl))
        installation = grant.installation  # read with the code (same app and organization)
        claims = tokens.base_claims(user.id, app.client_id, settings.id_token_ttl)
        # When the user authenticated with the platform (carried from the sandbox token through
        # the launch), so every flow of one platform session carries the same auth_time.
        claims["auth_time"] = grant.auth_time if grant.auth_time is not None else claims["iat"]
        claims.update(id_token_claims(app, user, installation, with_billing, now, grant.nonce))
        return {"access_token": access_token, "id_token": tokens.sign(claims), "token_type": "Bearer",
                "expires_in": settings.access_token_ttl, "scope": scope}
