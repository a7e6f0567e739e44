"""The authorization code grant: the authorize step (launch -> code) and the code exchange."""
from __future__ import annotations


from connectors import practitioner_of
from models.application import Application
from models.grants import AuthorizationCode, Redemption, expiry
from models.ids import new_secret
from oauth.authorize_checks import CHECKS, Authorization, query_value
from errors import ApiError
from oauth.errors import AuthorizeError, OAuthError, invalid_grant, redirect_description
from oauth.params import text_param
from oauth.pkce import PkceError, verify
from oauth.redirects import RedirectUriError, match_redirect_uri, normalise_redirect_uri, with_query
from oauth.launch_tokens import launch_token_response
from oauth.scopes import refresh_access
from oauth.smart_grants import CODE_REPLAYED, revoke_grants_of_jtis, start_grant
from oauth.smart_scopes import LAUNCH_SCOPES


def _normalised_or_none(uri: str) -> str | None:
    try:
        return normalise_redirect_uri(uri)
    except RedirectUriError:
        return None


class AuthorizationRequest:
    """`GET` or `POST /oauth/authorize`: turns a valid launch into a one-time code for the client."""

    def __init__(self, runtime):
        self.runtime = runtime

    def client_and_redirect(self, params: dict) -> tuple[Application, str]:
        """Errors here are shown, never redirected: the client or its redirect_uri is untrusted."""
        client_id = query_value(params, "client_id")
        if client_id is None:
            raise AuthorizeError("invalid_request", "The client_id parameter is required.")
        app = self.runtime.applications.by_client_id(client_id)
        if app is None:
            raise AuthorizeError("invalid_client", "Unknown client_id.")
        redirect_uri = query_value(params, "redirect_uri")
        if redirect_uri is None:
            raise AuthorizeError("invalid_request", "The redirect_uri parameter is required.")
        try:
            # From here on only the normalised URI is used: it is what was checked.
            redirect_uri = match_redirect_uri(redirect_uri, app.redirect_uri, app.redirect_uri_match,
                                              app.redirect_uris or ())
        except RedirectUriError as exc:
            raise AuthorizeError("invalid_request", f"redirect_uri does not match the application's "
                                                    f"registration: {exc}.") from None
        longest = AuthorizationCode.redirect_uri.max_length  # the code is bound to it
        if len(redirect_uri) > longest:
            raise AuthorizeError("invalid_request", f"redirect_uri must be at most {longest} characters.")
        return app, redirect_uri

    def issue_code(self, params: dict) -> str:
        """The URL to redirect to: redirect_uri with `code`, `state` and `iss` (RFC 9207).
        Once the client and redirect_uri are trusted, the named checks run in order
        (`oauth.authorize_checks.CHECKS`); their AuthorizeError carries the redirect_uri, and
        `error_location` turns it into the redirect."""
        app, redirect_uri = self.client_and_redirect(params)
        request = Authorization(self.runtime, app, redirect_uri, params, self.runtime.clock.now())
        for check in CHECKS:
            check(request)
        launch, now = request.launch, request.now
        code = new_secret(32)
        AuthorizationCode.create(
            code_hash=self.runtime.hasher.digest(code), key_id=self.runtime.hasher.key_id, application=app.id, user=launch.user_id,
            organization=launch.organization_id, launch=launch.id, redirect_uri=redirect_uri,
            nonce=request.value("nonce"), code_challenge=request.challenge, created_at=now,
            expires_at=expiry(now, self.runtime.settings.code_ttl), auth_time=request.auth_time, scope=request.scope,
            patient_id=launch.patient_id)
        return with_query(redirect_uri, code=code, state=request.state, iss=self.runtime.settings.issuer_claim)

    def error_location(self, err: AuthorizeError) -> str:
        """RFC 6749 4.1.2.1 error redirect, with `iss` (RFC 9207) like every authorization response."""
        return with_query(err.redirect_uri, error=err.error, error_description=redirect_description(err.description),
                          state=err.state,
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
        grant = None
        for code_hash in runtime.hasher.digests(code):  # SVC_HMAC_KEY's hash, then SVC_HMAC_KEY_PREVIOUS's
            grant = grant or AuthorizationCode.redeem(runtime.db, code_hash, app.id, runtime.clock.now(), jti)
        if grant is None:
            raise invalid_grant("The authorization code is invalid.")
        if not grant.first_use:
            # RFC 6749 4.1.2: a replayed code revokes what its first use issued.
            runtime.denylist.deny(grant.issued_jtis, until=runtime.clock.time() + runtime.settings.access_token_ttl)
            revoke_grants_of_jtis(runtime, grant.issued_jtis, "code_replayed")  # and its refresh tokens
            raise invalid_grant(CODE_REPLAYED)
        if grant.expires_at <= grant.used_at:
            raise invalid_grant("The authorization code has expired.")
        if redirect_uri is not None and _normalised_or_none(redirect_uri) != grant.redirect_uri:
            raise invalid_grant("redirect_uri does not match the one the code was issued for.")
        try:
            verify(grant.code_challenge, params.get("code_verifier"))
        except PkceError as exc:
            raise invalid_grant(str(exc)) from None
        try:  # the installation (read with the code) still allows use: `lifecycle.activation`
            runtime.activation.require(grant.installation, runtime.activation.USE)
        except ApiError as exc:
            raise OAuthError(exc.error, exc.message, status=exc.status) from None
        return self.tokens_for(app, grant, with_billing, jti)

    def tokens_for(self, app: Application, grant: Redemption, with_billing: bool, jti: str) -> dict:
        runtime = self.runtime
        user = grant.user
        scope = grant.scope or "openid"
        granted = frozenset(scope.split())
        fhir_user = None
        if "fhirUser" in granted:  # SMART: the user as a FHIR resource of the clinic's FHIR API
            practitioner = practitioner_of(runtime, grant.organization_id, user.id)
            if practitioner is not None:  # never a reference that would not resolve
                fhir_user = f"{runtime.fhir_base_url(grant.organization_id)}/Practitioner/{practitioner}"
        # SMART launch context: a launch with a patient puts it in the token and the response, and
        # only when the app was granted `launch` or `launch/patient` (SMART App Launch 2, scopes).
        context = {"patient": grant.patient_id} if grant.patient_id and granted.intersection(LAUNCH_SCOPES) else {}
        response = launch_token_response(runtime, app, user, grant.organization_id, grant.installation, scope,
                                         context, grant.auth_time, with_billing, jti, grant.nonce, fhir_user)
        access = refresh_access(scope)
        if access is not None:  # SMART offline_access / online_access: the grant's first refresh token
            response["refresh_token"] = start_grant(runtime, app, grant, access, context, fhir_user, jti)
        return response
