"""The scopes an authorization request may name, and what of them is granted.

Platform scopes: `openid` plus one scope per user field an application can declare: `email` (email),
`profile` (name: given_name, family_name), `ehr_username` and `organization` (the namespaced
userinfo claims). What userinfo releases is decided by the application's declared user fields (its
manifest); a scope never releases a field the app did not declare.

SMART App Launch scopes: `launch`, `launch/patient`, `fhirUser` and the resource scopes
(`patient/…`, `user/…`, `system/…`; oauth/smart_scopes.py). These are granted only as far as the
application declared them (`Application.smart_scopes`): what it declared AND asked for, never more.

SMART refresh scopes: `offline_access` and `online_access` (a refresh token; oauth/refresh_token.py),
granted only as far as declared, and one of them per grant: asked for both, a grant gets
`offline_access` when the app declared it, else `online_access`.

At authorize a scope svc-auth does not grant is left out, not an error (RFC 6749 3.3, SMART 2.2):
an unknown name, a malformed or unsupported resource scope (granular `?…`), a scope the app did not
declare. The granted `scope` says what was granted. The request is refused (`invalid_scope`) only
when nothing it asks for can be granted (with `openid`, always granted, asked or not, counting only
when asked), or when it asks for `partner_api`, which no user-facing grant may ever have.
`apps create|update --smart-scopes` stays strict: an unknown declared name is an error.

The client credentials grant grants `partner_api` only.
"""
from __future__ import annotations

from oauth import smart_scopes
from oauth.errors import OAuthError

SUPPORTED_SCOPES = ("openid", "email", "profile", "ehr_username", "organization")
OFFLINE_ACCESS, ONLINE_ACCESS = "offline_access", "online_access"
REFRESH_SCOPES = (OFFLINE_ACCESS, ONLINE_ACCESS)
"""SMART: the scopes that give a grant a refresh token (offline outlives the hub session, online not)."""
SMART_CONTEXT_SCOPES = (*smart_scopes.LAUNCH_SCOPES, "fhirUser", *REFRESH_SCOPES)
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
    """Strict: every name is a scope this server knows (an application's declaration)."""
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
    `smart_scopes`) covers them; at most one of `offline_access`/`online_access`. What cannot be
    granted is left out; InvalidScope when nothing asked can be granted, or for `partner_api`."""
    names = (requested or "").split()
    if PARTNER_API_SCOPE in names:
        raise InvalidScope(f"{PARTNER_API_SCOPE!r} is the client credentials grant's scope; no user-facing "
                           f"authorization grants it.")
    declared_names = tuple(dict.fromkeys((declared or "").split()))  # in declared order: the grant is stable
    try:
        declared_resources = smart_scopes.resource_scopes(" ".join(
            n for n in declared_names if smart_scopes.is_resource_scope(n)))
    except smart_scopes.ScopeSyntaxError:  # a bad declaration grants nothing, never a 500
        declared_resources = []
    granted, usable = ["openid"], False
    for name in names:
        before = len(granted)
        if name in SUPPORTED_SCOPES or (name in SMART_CONTEXT_SCOPES and name in declared_names):
            granted.append(name)
        elif (asked := smart_scopes.parse_or_none(name)) is not None:
            granted += [str(s) for s in smart_scopes.grant([asked], declared_resources)]
        usable = usable or len(granted) > before or name == "openid"
    if names and not usable:
        raise InvalidScope(f"None of the requested scopes can be granted to this application: {' '.join(names)[:300]}")
    if OFFLINE_ACCESS in granted and ONLINE_ACCESS in granted:  # one per grant: the wider one
        granted.remove(ONLINE_ACCESS)
    return " ".join(dict.fromkeys(granted))


def refresh_access(scope: str | None) -> str | None:
    """"offline" or "online" when `scope` grants a refresh token, else None."""
    names = (scope or "").split()
    return "offline" if OFFLINE_ACCESS in names else "online" if ONLINE_ACCESS in names else None


def validate_declared(scope: str) -> str:
    """An application's declared SMART scopes, normalised (`apps create|update --smart-scopes`);
    InvalidScope for a name this server does not know."""
    names = scope.split()
    _check_known(names)
    return " ".join(dict.fromkeys(names))
