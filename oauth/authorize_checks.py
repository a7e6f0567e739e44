"""The authorize endpoint's checks, each named after what it requires, run in one list.

Once the client and its redirect URI are trusted (`AuthorizationRequest.client_and_redirect`),
`AuthorizationRequest.issue_code` runs `CHECKS` in order over one `Authorization` (as
node-oidc-provider composes its actions). A check reads the request, records what it learnt
(the PKCE challenge, the granted scope, the launch...) and raises `AuthorizeError` with the
redirect URI, so the client is told. A dialect (SMART) adds its own checks to the list rather than
branching inside these.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
from urllib.parse import quote_plus

from errors import ApiError
from models.application import Application
from models.grants import AuthorizationCode, Launch
from oauth.errors import AuthorizeError
from oauth.pkce import PkceError, challenge_of
from oauth.scopes import REFRESH_SCOPES, InvalidScope, granted_scope
from oauth.tokens import InvalidToken

# OIDC Core 3.1.2.1 prompt values. There is no interactive login (the platform authenticated
# the user before the launch), so `login` cannot be honoured and is answered login_required.
# `consent` is already given (the clinic installed the app) and `select_account` has one answer
# (the launch's user): both pass, showing nothing.
PROMPT_VALUES = frozenset({"none", "login", "consent", "select_account"})
STALE_LAUNCH = "The launch is unknown, expired, already used or issued for another client."
MAX_STATE_LENGTH = 2048
"""The longest state, %-encoded as the authorization response carries it back: with the longest
redirect_uri (1000) and error description (`oauth.errors.redirect_description`), a response's
Location stays under 5 KB, which the shipped nginx passes on (`proxy_buffer_size 8k`)."""


def query_value(params: dict, name: str) -> str | None:
    value = params.get(name)
    return value if isinstance(value, str) and value else None


@dataclasses.dataclass
class Authorization:
    """One authorization request as the checks see it, and what they established."""
    runtime: object
    app: Application
    redirect_uri: str
    params: dict
    now: dt.datetime
    challenge: str | None = None
    scope: str | None = None
    prompt: frozenset = frozenset()
    max_age: int | None = None
    launch_id: str | None = None
    launch: Launch | None = None
    auth_time: int | None = None

    @property
    def state(self) -> str | None:
        return query_value(self.params, "state")

    def value(self, name: str) -> str | None:
        return query_value(self.params, name)

    def fail(self, error: str, description: str) -> AuthorizeError:
        return AuthorizeError(error, description, redirect_uri=self.redirect_uri, state=self.state)

    @property
    def no_launch_error(self) -> str:
        """Without a usable launch no user is signed in: with prompt=none that is login_required
        (OIDC Core 3.1.2.6), otherwise a malformed request."""
        return "login_required" if "none" in self.prompt else "invalid_request"


def state_length(a: Authorization) -> None:
    """First: a state too long to carry back is shown, never redirected (the redirect would carry it)."""
    if a.state is not None and len(quote_plus(a.state)) > MAX_STATE_LENGTH:
        raise AuthorizeError("invalid_request", f"state must be at most {MAX_STATE_LENGTH} characters once "
                                                "URL-encoded: the authorization response carries it back.")


def no_request_object(a: Authorization) -> None:
    """Before the other parameters are read: with a request object they may be inside it."""
    if "request" in a.params:
        raise a.fail("request_not_supported", "Request objects (the request parameter) are not supported.")
    if "request_uri" in a.params:
        raise a.fail("request_uri_not_supported", "The request_uri parameter is not supported.")


def response_type_code(a: Authorization) -> None:
    response_type = a.value("response_type")
    if response_type is None:
        raise a.fail("invalid_request", "The response_type parameter is required.")
    if response_type != "code":
        raise a.fail("unsupported_response_type", "Only response_type=code is supported.")


def query_response_mode(a: Authorization) -> None:
    """OAuth 2.0 Multiple Response Types 2.1: the response comes back in the query, the only mode
    this server has (`response_modes_supported`). Another mode (`fragment`, `form_post`, JARM's
    `query.jwt`...) is refused, never answered in the query instead: the client asked for its
    response elsewhere, or signed, and would not expect the code where it would land."""
    mode = a.value("response_mode")
    if mode is not None and mode != "query":
        raise a.fail("invalid_request", "response_mode must be query (the only response mode supported).")


def pkce_challenge(a: Authorization) -> None:
    """RFC 7636: an S256 challenge, required when the application requires PKCE and for every
    public client (it has no secret: the verifier is what binds the code to it)."""
    try:
        a.challenge = challenge_of(a.params, required=a.app.require_pkce or a.app.public)
    except PkceError as exc:
        raise a.fail("invalid_request", str(exc)) from None


def granted(a: Authorization) -> None:
    """Platform scopes as asked; SMART scopes (launch, fhirUser, resource scopes, offline_access or
    online_access) only as far as the application declared them (`Application.smart_scopes`): never
    more than both say; what cannot be granted is left out (`oauth.scopes`). Only a SMART launch
    (the `launch` parameter) gets a refresh scope: the spec's own SDK flow (`launch_id`) issues an
    access token that "cannot be refreshed"."""
    try:
        scope = granted_scope(a.value("scope"), a.app.smart_scopes)
    except InvalidScope as exc:
        raise a.fail("invalid_scope", exc.message) from None
    if a.value("launch") is None:
        scope = " ".join(n for n in scope.split() if n not in REFRESH_SCOPES)
    a.scope = scope


def prompt_values(a: Authorization) -> None:
    prompt = frozenset((a.value("prompt") or "").split())
    if prompt - PROMPT_VALUES or ("none" in prompt and len(prompt) > 1):
        raise a.fail("invalid_request", "prompt must be none, or any of login, consent, select_account.")
    a.prompt = prompt


def max_age_value(a: Authorization) -> None:
    max_age = a.value("max_age")
    if max_age is not None:
        if not (max_age.isascii() and max_age.isdigit()) or len(max_age) > 10:
            raise a.fail("invalid_request", "max_age must be a whole number of seconds.")
        a.max_age = int(max_age)


def nonce_value(a: Authorization) -> None:
    """The nonce (OIDC Core 3.1.2.1) is bound to the code, so it is at most what a code can carry."""
    nonce, longest = a.value("nonce"), AuthorizationCode.nonce.max_length
    if nonce is not None and len(nonce) > longest:
        raise a.fail("invalid_request", f"nonce must be at most {longest} characters.")


def no_interactive_login(a: Authorization) -> None:
    if "login" in a.prompt:
        raise a.fail("login_required", "This server has no interactive login: the platform signs the user in "
                                       "before it creates a launch.")


def smart_launch_alias(a: Authorization) -> None:
    """SMART: `launch` names the launch as `launch_id` does; both given must agree."""
    launch_id, launch = a.value("launch_id"), a.value("launch")
    if launch_id is not None and launch is not None and launch_id != launch:
        raise a.fail("invalid_request", "launch and launch_id name different launches.")
    a.launch_id = launch_id or launch or a.value("login_hint")


def live_launch(a: Authorization) -> None:
    """The launch (`launch_id`, `launch`, or `login_hint`) was issued to this client, unused and unexpired."""
    launch_id = a.launch_id
    if launch_id is None:
        raise a.fail(a.no_launch_error, "The launch_id parameter is required: open the app from the platform.")
    launch = Launch.of_application(launch_id, a.app.id)  # with the app's installation in its clinic
    if launch is None or launch.used_at is not None or launch.expires_at <= a.now:
        raise a.fail(a.no_launch_error, STALE_LAUNCH)
    a.launch = launch
    a.auth_time = launch.auth_time
    if a.auth_time is None:  # a launch created before auth_time was recorded
        a.auth_time = int(launch.created_at.replace(tzinfo=dt.timezone.utc).timestamp())


def openable_installation(a: Authorization) -> None:
    """The app may still be opened in the launch's clinic (`lifecycle.activation`, through the
    runtime): a launch created before the app was Disabled there opens nothing (`access_denied`)."""
    try:
        a.runtime.activation.require(a.launch.installation, a.runtime.activation.OPEN)
    except ApiError as exc:
        raise a.fail("access_denied", exc.message) from None


def smart_audience(a: Authorization) -> None:
    """SMART: `aud`, when given, is the FHIR base (`iss`) of the launch's clinic (a trailing slash
    aside), so a token is never minted for a resource server the app did not mean."""
    aud = a.value("aud")
    if aud is None:
        return
    iss = a.runtime.fhir_base_url(a.launch.organization_id)
    if aud.rstrip("/") != iss.rstrip("/"):
        raise a.fail("invalid_request", f"aud must be this clinic's FHIR base URL ({iss}).")


def recent_sign_in(a: Authorization) -> None:
    """max_age: the user signed in to the platform recently enough. The launch stays unused, so
    a fresher platform sign-in can still open the app."""
    if a.max_age is not None and a.runtime.clock.time() - a.auth_time > a.max_age:
        raise a.fail("login_required", "The user authenticated with the platform longer ago than max_age.")


def hinted_user(a: Authorization) -> None:
    """OIDC Core 3.1.2.1 `id_token_hint`: an ID token this server issued to this client (expired or
    not) names the user the client expects; a launch for anyone else is `login_required` (no other
    user can be signed in here), and the launch stays unused. A hint that is no such ID token is
    `invalid_request`, never ignored."""
    hint = a.value("id_token_hint")
    if hint is None:
        return
    try:
        claims = a.runtime.tokens.hint_claims(hint, a.app.client_id)
    except InvalidToken:
        raise a.fail("invalid_request", "id_token_hint is not an ID token this server issued to this client.") from None
    if claims.get("sub") != a.launch.user_id:
        raise a.fail("login_required", "The launch's user is not the user id_token_hint names.")


def launch_consumed(a: Authorization) -> None:
    """Last: the launch is used once, by whoever consumes it first."""
    if not a.launch.consume(a.now):
        raise a.fail(a.no_launch_error, STALE_LAUNCH)


CHECKS = (state_length, no_request_object, response_type_code, query_response_mode, pkce_challenge, granted, prompt_values, max_age_value, nonce_value,
          no_interactive_login, smart_launch_alias, live_launch, openable_installation, smart_audience, recent_sign_in,
          hinted_user, launch_consumed)
