"""The authorization code grant: the authorize step (launch -> code) and the code exchange."""
from __future__ import annotations

from models.application import Application
from models.grants import AuthorizationCode, Launch, Redemption, expiry
from models.ids import new_secret
from oauth.claims import id_token_claims
from oauth.errors import AuthorizeError, invalid_grant
from oauth.params import text_param
from oauth.pkce import PkceError, challenge_of, verify
from oauth.redirects import RedirectUriError, match_redirect_uri, normalise_redirect_uri, with_query
from oauth.tokens import PLATFORM_AUDIENCE


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
        try:
            challenge = challenge_of(params, required=app.require_pkce)
        except PkceError as exc:
            raise fail("invalid_request", str(exc)) from None
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
            nonce=_query_value(params, "nonce"), code_challenge=challenge, created_at=now,
            expires_at=expiry(now, self.runtime.settings.code_ttl))
        return with_query(redirect_uri, code=code, state=state)


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
        claims = tokens.base_claims(user.id, app.client_id, settings.id_token_ttl)
        claims["auth_time"] = claims["iat"]
        claims.update(id_token_claims(app, user, grant.installation, with_billing, now, grant.nonce))
        id_token = tokens.sign(claims)
        access_token, _ = tokens.access_token(
            user.id, PLATFORM_AUDIENCE, settings.access_token_ttl,
            client_id=app.client_id, org=grant.organization_id, scope="openid", jti=jti,
            # The ID token issued with this access token, sealed so only this service can read it:
            # the platform's verification returns it to the hub for the app's SDK (identity-provider
            # variant; lifecycle.verification.platform_introspection). Nothing is stored.
            svc_idt=self.runtime.hasher.seal(id_token, jti))
        return {"access_token": access_token, "id_token": id_token, "token_type": "Bearer",
                "expires_in": settings.access_token_ttl, "scope": "openid"}
