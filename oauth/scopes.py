"""The scopes an authorization request may name (anything else: `invalid_scope`).

Platform scopes: `openid` plus one scope per user field an application can declare: `email` (email),
`profile` (name: given_name, family_name), `ehr_username` and `organization` (the namespaced
userinfo claims). What userinfo releases is decided by the application's declared user fields (its
manifest); a scope never releases a field the app did not declare.

SMART App Launch scopes: `launch`, `launch/patient`, `fhirUser` and the resource scopes
(`patient/…`, `user/…`, `system/…`; oauth/smart_scopes.py). These are granted only as far as the
application declared them (`Application.smart_scopes`): what it declared AND asked for, never more.

The client credentials grant grants `partner_api` only.
"""
from __future__ import annotations

from oauth import smart_scopes
from oauth.errors import OAuthError

SUPPORTED_SCOPES = ("openid", "email", "profile", "ehr_username", "organization")
SMART_CONTEXT_SCOPES = ("launch", "launch/patient", "fhirUser")
"""SMART scopes that are not resource scopes: granted only when declared."""
SMART_EXAMPLE_RESOURCE_SCOPES = ("patient/*.rs", "user/*.rs")
"""Resource scopes as discovery documents advertise them (any `patient/`/`user/` type and permission works)."""
PARTNER_API_SCOPE = "partner_api"  # the client credentials grant's only scope (at /v1)


class InvalidScope(OAuthError):
    def __init__(self, description: str):
        super().__init__("invalid_scope", description)


def advertised_scopes() -> list[str]:
    """Scopes a discovery document lists (`scopes_supported`)."""
    return [*SUPPORTED_SCOPES, *SMART_CONTEXT_SCOPES, *SMART_EXAMPLE_RESOURCE_SCOPES]


def _check_known(names: list[str]) -> None:
    for name in names:
        if name in SUPPORTED_SCOPES or name in SMART_CONTEXT_SCOPES:
            continue
        if smart_scopes.is_resource_scope(name):
            try:
                smart_scopes.parse(name)
            except smart_scopes.ScopeSyntaxError as exc:
                raise InvalidScope(str(exc)) from None
            continue
        raise InvalidScope(f"Unknown scope {name!r}; supported: {' '.join(SUPPORTED_SCOPES)} "
                           f"{' '.join(SMART_CONTEXT_SCOPES)} and SMART resource scopes (patient/Type.rs).")


def granted_scope(requested: str | None, declared: str | None = None) -> str:
    """The scope string granted for `requested` (space-separated); `openid` is always granted.
    Platform scopes are granted as asked; SMART scopes only as far as `declared` (the application's
    `smart_scopes`) covers them. Raises InvalidScope naming the first unknown or malformed scope."""
    names = (requested or "").split()
    _check_known(names)
    declared_names = tuple(dict.fromkeys((declared or "").split()))  # in declared order: the grant is stable
    try:
        declared_resources = smart_scopes.resource_scopes(" ".join(
            n for n in declared_names if smart_scopes.is_resource_scope(n)))
    except smart_scopes.ScopeSyntaxError:  # a bad declaration grants nothing, never a 500
        declared_resources = []
    granted = ["openid"]
    for name in names:
        if name in SUPPORTED_SCOPES or (name in SMART_CONTEXT_SCOPES and name in declared_names):
            granted.append(name)
        elif smart_scopes.is_resource_scope(name):
            granted += [str(s) for s in smart_scopes.grant([smart_scopes.parse(name)], declared_resources)]
    return " ".join(dict.fromkeys(granted))


def validate_declared(scope: str) -> str:
    """An application's declared SMART scopes, normalised (`apps create|update --smart-scopes`);
    InvalidScope for a name this server does not know."""
    names = scope.split()
    _check_known(names)
    return " ".join(dict.fromkeys(names))
