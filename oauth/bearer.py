"""The one gate for bearer tokens (RFC 6750), on the lines of Authlib's `ResourceProtector` and
`TokenValidator`: every resource that takes `Authorization: Bearer` (userinfo, the partner API,
the FHIR API, the sandbox API) asks a `BearerGate`, and only this module reads a bearer token or
writes a `WWW-Authenticate: Bearer` challenge.

A gate names its audience (which tokens it takes) and declares what its resource adds as
requirements, run in order on the `Caller` once the token is live (signed, unexpired, not on the
deny-list): `known_user` (the token's user still exists in the token's clinic; read with the app's
installation there in one query, or from `runtime.directory` while the directory is unchanged), `own_clinic` (the FHIR API's path names the token's clinic),
`usable_installation` (`lifecycle.activation` allows the app's use there), `confidential_client`
(the partner API is never a public client's).

Refusals share one challenge (`challenge`): no token at all is 401 `Bearer realm="svc-auth"`, with
no error attribute (RFC 6750 3.1); a malformed, expired, revoked or orphaned token is 401
`Bearer error="invalid_token", error_description="…", realm="svc-auth"`; a missing scope is 403
`insufficient_scope` with the `scope` that would do. The body is
the resource's own (JSON `{"error", "message"}`; the FHIR API renders an OperationOutcome).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from errors import ApiError
from models.ids import fhir_id
from oauth.tokens import InvalidToken

REALM = "svc-auth"
MISSING = "A Bearer access token is required: Authorization: Bearer <access_token>."
INVALID = "The access token is invalid, expired or revoked."


def bearer_value(authorization: str | None) -> str | None:
    """The token in `Authorization: Bearer <t>` or, as the spec's sample does, `Authorization: <t>`."""
    if not authorization:
        return None
    scheme, _, rest = authorization.strip().partition(" ")
    if rest and scheme.lower() == "bearer":
        return rest.strip() or None
    if not rest:
        return scheme
    return None


def _quoted(value: str) -> str:
    """An RFC 7230 quoted-string's content: no `"` or `\\` (RFC 6750 3 forbids them in these values)."""
    return "".join(c for c in value if c not in '"\\' and 0x20 <= ord(c) < 0x7F)


def challenge(realm: str = REALM, error: str | None = None, description: str | None = None,
              scope: str | None = None) -> str:
    """The `WWW-Authenticate` value: `Bearer [error="…", error_description="…", [scope="…", ]]realm="…"`.

    The error comes first, where CONTRACTS and clients look for it (`Bearer error="invalid_token"`);
    RFC 7235 auth-params are unordered, so the realm closes the list."""
    params = []
    if error:
        params.append(f'error="{error}"')
        if description:
            params.append(f'error_description="{_quoted(description)}"')
        if scope:
            params.append(f'scope="{_quoted(scope)}"')
    params.append(f'realm="{_quoted(realm)}"')
    return "Bearer " + ", ".join(params)


class BearerRefused(ApiError):
    """A refused bearer token: 401 (or 403 insufficient_scope) with the RFC 6750 challenge."""

    def __init__(self, status: int, error: str, message: str, realm: str = REALM, challenge_error: str | None = None,
                 scope: str | None = None):
        super().__init__(status, error, message,
                         {"WWW-Authenticate": challenge(realm, challenge_error, message, scope)})


def missing_token(message: str = MISSING, realm: str = REALM) -> BearerRefused:
    """401 when no token was sent: RFC 6750 3.1 says the challenge then carries no error code."""
    return BearerRefused(401, "invalid_token", message, realm)


def invalid_token(message: str = INVALID, realm: str = REALM) -> BearerRefused:
    """401 `invalid_token`: malformed, expired, revoked, another audience, or its subject is gone."""
    return BearerRefused(401, "invalid_token", message, realm, "invalid_token")


def insufficient_scope(message: str, scope: str | None = None, realm: str = REALM) -> BearerRefused:
    """403 `insufficient_scope` (RFC 6750 3.1), naming the scope that would do when there is one."""
    return BearerRefused(403, "insufficient_scope", message, realm, "insufficient_scope", scope)


def live_claims(runtime, token: str | None, audience: str) -> dict | None:
    """Claims of a live (signed, unexpired, unrevoked) token for `audience`, else None."""
    if not token:
        return None
    try:
        claims = runtime.tokens.verify(token, audience)
    except InvalidToken:
        return None
    if not isinstance(claims.get("jti"), str) or runtime.denylist.is_denied(claims["jti"]):
        return None
    return claims


@dataclasses.dataclass(frozen=True)
class Caller:
    """Who presented a live token: its claims, its application and, as the gate's requirements
    read them, its user (with `user.organization`) and the app's installation in the user's clinic."""

    claims: dict
    app: object
    user: object = None
    installation: object = None

    @property
    def organization_id(self) -> str | None:
        value = self.claims.get("org")
        return value if isinstance(value, str) else None

    @property
    def user_id(self) -> str | None:
        """The token's user (`sub`); a system token's caller has none (`fhir_api.system_access`)."""
        value = self.claims.get("sub")
        return value if isinstance(value, str) else None

    @property
    def declared_scopes(self) -> str | None:
        """What the app declares now (its SMART scopes): the FHIR API allows what both it and the token name."""
        return self.app.smart_scopes

    @property
    def patient(self) -> str | None:
        """The SMART launch's patient context, when the token carries one, in R4's spelling (a token
        issued before issue 35 may carry `pat_…`: `models.ids.fhir_id`)."""
        value = self.claims.get("patient")
        return fhir_id(value) if isinstance(value, str) and value else None


Requirement = Callable[["BearerGate", object, Caller, dict], Caller]
"""`(gate, runtime, caller, context) -> caller` (possibly with more read), or raises."""


def known_user(gate: "BearerGate", runtime, caller: Caller, context: dict) -> Caller:
    """The token's user still exists, in the token's clinic; read with them: their clinic and the app's
    installation there (`app_cache.directory`: from memory while no user, clinic or installation changed)."""
    user = runtime.directory.user_with_installation(caller.claims.get("sub"), caller.app.id)
    if user is None or user.organization_id != caller.organization_id:
        raise gate.invalid("The access token's user no longer exists in its clinic.")
    return Caller(caller.claims, caller.app, user, user.installation)  # not dataclasses.replace: a third of the cost


def own_clinic(gate: "BearerGate", runtime, caller: Caller, context: dict) -> Caller:
    """The resource's clinic (`organization_id` of the request) is the token's: another clinic's
    resources answer 404, as if they did not exist (the FHIR API)."""
    if caller.organization_id != context.get("organization_id"):
        raise ApiError(404, "not_found", "No such FHIR base.")
    return caller


def usable_installation(gate: "BearerGate", runtime, caller: Caller, context: dict) -> Caller:
    """The app is installed in the user's clinic and its status allows use (`lifecycle.activation`,
    reached as `runtime.activation`): else 403 `not_installed` / `application_disabled`.
    Needs `known_user` before it."""
    runtime.activation.require(caller.installation, runtime.activation.USE)
    return caller


def confidential_client(gate: "BearerGate", runtime, caller: Caller, context: dict) -> Caller:
    """A public client has no secret: the partner API is never its."""
    if caller.app.public:
        raise gate.invalid()
    return caller


class BearerGate:
    """`caller(runtime, authorization, **context)`: the `Caller` of a request, or its refusal.

    `audience`: which tokens it takes. User tokens (the platform audience) name their app by
    `client_id` and their user by `sub`; client-credentials tokens name their app by `sub`. The
    app comes from the runtime's application cache (no database read on a hit)."""

    def __init__(self, audience: str, realm: str = REALM, requirements: tuple[Requirement, ...] = (),
                 app_claim: str = "client_id", missing: str = MISSING, message: str | None = None):
        self.audience = audience
        self.realm = realm
        self.requirements = requirements
        self.app_claim = app_claim
        self.missing_message = missing
        self.message = message  # a fixed message for every 401 (the sandbox API's "Authentication failed")

    def invalid(self, message: str = INVALID) -> BearerRefused:
        return invalid_token(self.message or message, self.realm)

    def claims(self, runtime, authorization: str | None) -> dict:
        """The live token's claims, or the 401."""
        return self.token_claims(runtime, bearer_value(authorization))

    def token_claims(self, runtime, token: str | None) -> dict:
        """`claims` of a token already taken out of its `Authorization` header."""
        if not token:
            raise missing_token(self.message or self.missing_message, self.realm)
        claims = live_claims(runtime, token, self.audience)
        if claims is None:
            raise self.invalid()
        return claims

    def caller(self, runtime, authorization: str | None, **context) -> Caller:
        return self.token_caller(runtime, bearer_value(authorization), **context)

    def token_caller(self, runtime, token: str | None, **context) -> Caller:
        """`caller` of a token already taken out of its `Authorization` header (introspection's `token`)."""
        claims = self.token_claims(runtime, token)
        lookup = runtime.applications.by_client_id if self.app_claim == "client_id" else runtime.applications.by_id
        app = lookup(claims.get(self.app_claim)) if self.app_claim else None
        if self.app_claim and app is None:
            raise self.invalid("The access token's application no longer exists.")
        caller = Caller(claims=claims, app=app)
        for requirement in self.requirements:
            caller = requirement(self, runtime, caller, context)
        return caller
