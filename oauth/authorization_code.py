"""The authorization code grant: the authorize step (launch -> code) and the code exchange."""
from __future__ import annotations

import datetime as dt

from models.application import Application
from models.grants import AuthorizationCode, Launch, Redemption, expiry
from models.ids import new_secret
from oauth.claims import id_token_claims
from oauth.errors import AuthorizeError, invalid_grant
from oauth.params import text_param
from oauth.pkce import PkceError, challenge_of, verify
from oauth.redirects import RedirectUriError, match_redirect_uri, normalise_redirect_uri, with_query
from oauth.scopes import InvalidScope, granted_scope
from oauth.tokens import PLATFORM_AUDIENCE

# OIDC Core 3.1.2.1 prompt values. There is no interactive login (the platform authenticated
# the user before the launch), so `login` cannot be honoured and is answered login_required.
PROMPT_VALUES = frozenset({"none", "login", "consent", "select_account"})


def _query_value(params: dict, name: str) -> str | None:
    value = params.get(name)
    return value if isinstance(value, str) and value else None


def _normalised_or_none(uri: str) -> str | None:
    try:
        return normalise_redirect_uri(uri)
    except RedirectUriError:
        return None


class AuthorizationRequest:
    """`GET /oauth/authorize`: turns a valid launch into a one-time code for the client."""

    def __init__(self, runtime):
        self.runtime = runtime

    def client_and_redirect(self, params: dict) -> tuple[Application, str]:
        """Errors here are shown, never redirected: the client or its redirect_uri is untrusted."""
        client_id = _query_value(params, "client_id")
        if client_id is None:
            raise AuthorizeError("invalid_request", "The client_id parameter is required.")
        app = self.runtime.applications.by_client_id(client_id)
        if app is None:
            raise AuthorizeError("invalid_client", "Unknown client_id.")
        redirect_uri = _query_value(params, "redirect_uri")
        if redirect_uri is None:
            raise AuthorizeError("invalid_request", "The redirect_uri parameter is required.")
        try:
            # From here on only the normalised URI is used: it is what was checked.
            redirect_uri = match_redirect_uri(redirect_uri, app.redirect_uri, app.redirect_uri_match,
                                              app.redirect_uris or ())
        except RedirectUriError as exc:
            raise AuthorizeError("invalid_request", f"redirect_uri does not match the application's "
                                                    f"registration: {exc}.") from None
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
            challenge = challenge_of(params, required=app.require_pkce)
        except PkceError as exc:
            raise fail("invalid_request", str(exc)) from None
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
            nonce=_query_value(params, "nonce"), code_challenge=challenge, created_at=now,
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
        """One database statement: the code is consumed and read, with its user and installation,
        by `AuthorizationCode.redeem`, which also notes the jti of the access token issued here."""
        code = text_param(params, "code")
        redirect_uri = text_param(params, "redirect_uri", required=False)
        runtime = self.runtime
        jti = new_secret(16)
        grant = AuthorizationCode.redeem(runtime.db, runtime.hasher.digest(code), app.id, runtime.clock.now(), jti)
        if grant is None:
            raise invalid_grant("The authorization code is invalid.")
        if not grant.first_use:
            # RFC 6749 4.1.2: a replayed code revokes what its first use issued.
            runtime.denylist.deny(grant.issued_jtis, until=runtime.clock.time() + runtime.settings.access_token_ttl)
            raise invalid_grant("The authorization code was already used; tokens issued from it are revoked.")
        if grant.expires_at <= grant.used_at:
            raise invalid_grant("The authorization code has expired.")
        if redirect_uri is not None and _normalised_or_none(redirect_uri) != grant.redirect_uri:
            raise invalid_grant("redirect_uri does not match the one the code was issued for.")
        try:
            verify(grant.code_challenge, params.get("code_verifier"))
        except PkceError as exc:
            raise invalid_grant(str(exc)) from None
        return self.tokens_for(app, grant, with_billing, jti)

    def tokens_for(self, app: Application, grant: Redemption, with_billing: bool, jti: str) -> dict:
        settings, tokens = self.runtime.settings, self.runtime.tokens
        now = self.runtime.clock.now()
        user = grant.user
        scope = grant.scope or "openid"
        claims = tokens.base_claims(user.id, app.client_id, settings.id_token_ttl)
        # When the user authenticated with the platform (carried from the sandbox token through
        # the launch), so every flow of one platform session carries the same auth_time.
        claims["auth_time"] = grant.auth_time if grant.auth_time is not None else claims["iat"]
        claims.update(id_token_claims(app, user, grant.installation, with_billing, now, grant.nonce))
        id_token = tokens.sign(claims)
        access_token, _ = tokens.access_token(
            user.id, PLATFORM_AUDIENCE, settings.access_token_ttl,
            client_id=app.client_id, org=grant.organization_id, scope=scope, jti=jti,
            # The ID token issued with this access token, sealed so only this service can read it:
            # the platform's verification returns it to the hub for the app's SDK (identity-provider
            # variant; lifecycle.verification.platform_introspection). Nothing is stored.
            svc_idt=self.runtime.hasher.seal(id_token, jti))
        return {"access_token": access_token, "id_token": id_token, "token_type": "Bearer",
                "expires_in": settings.access_token_ttl, "scope": scope}
