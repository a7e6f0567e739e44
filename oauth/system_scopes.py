"""SMART system scopes (`system/{Type}.{permissions}`) of backend apps: what an app may register
(`apps create|update --system-scopes`) and what a `client_credentials` request is granted.

Read-only, always: a system token reads and searches (and exports) the FHIR API, never writes.
- Registering: every name is a `system/` scope naming a served type (or `*`) with read/search
  permissions only (v2 `r`, `s`, `rs`; v1 `read`): anything else is refused with the reason.
- Granting (`grant_system_scopes`): each asked scope is granted as far as a registered one covers
  it, narrowed to read/search: v1 `.read` (and v1 `.*`, read as `.read`), v2 letters keeping only
  `r` and `s` (`.cruds` -> `.rs`). A non-system scope, an unknown type or action, or a write-only
  one is dropped; nothing left is `invalid_scope` (SMART Backend Services, CONTRACTS.md).
A granted scope keeps the asker's spelling: v1 stays v1 (`system/Patient.read`), unless the
registration narrows it to read or search alone (then the v2 letter).
"""
from __future__ import annotations

from connectors.us_core import SUPPORTED_TYPES
from oauth import smart_scopes
from oauth.scopes import InvalidScope

EXTRA_TYPES = ("Group",)
"""Served to system tokens besides the FHIR API's US Core types: Bulk Data's Group (issue 48)."""
READ_ONLY = "rs"
MAX_SCOPE_LENGTH = 4000


def served_types() -> tuple[str, ...]:
    return (*SUPPORTED_TYPES, *EXTRA_TYPES)


def _read_only(permissions: str) -> str:
    return "".join(p for p in permissions if p in READ_ONLY)


def validate_registered(scope: str) -> str:
    """An app's registered system scopes, normalised (space-separated, no duplicates); ValueError
    naming the first that cannot be registered."""
    if not isinstance(scope, str) or len(scope) > MAX_SCOPE_LENGTH or "\x00" in scope:
        raise ValueError("system scopes must be a space-separated list of system/Type.rs scopes")
    names = list(dict.fromkeys(scope.split()))
    for name in names:
        parsed = smart_scopes.parse_or_none(name)
        if parsed is None or parsed.context != "system":
            raise ValueError(f"{name[:100]!r} is not a system scope (system/Type.rs, system/*.rs)")
        if parsed.resource_type != "*" and parsed.resource_type not in served_types():
            raise ValueError(f"{name!r}: {parsed.resource_type} is not a type the FHIR API serves")
        if _read_only(parsed.permissions) != parsed.permissions:
            raise ValueError(f"{name!r}: system scopes are read-only (r, s, rs or v1 read)")
    return " ".join(names)


def _asked(name: str):
    """(scope, v1 spelling?) of an asked name when it is a system scope of a served type or `*`
    with a read or search permission, else None (it is dropped)."""
    if not smart_scopes.is_resource_scope(name) or not name.startswith("system/"):
        return None
    parsed = smart_scopes.parse_or_none(name)
    if parsed is None or (parsed.resource_type != "*" and parsed.resource_type not in served_types()):
        return None
    action = name.rsplit(".", 1)[1]
    v1 = action in smart_scopes.V1_PERMISSIONS
    permissions = _read_only(parsed.permissions)
    if not permissions:
        return None
    return smart_scopes.ResourceScope("system", parsed.resource_type, permissions), v1


def _spelled(scope, v1: bool) -> str:
    if v1 and scope.permissions == READ_ONLY:
        return f"system/{scope.resource_type}.read"
    return str(scope)


def grant_system_scopes(requested: str | None, registered: str | None) -> str:
    """The scope string granted to a backend app asking `requested` with `registered` system
    scopes; InvalidScope when none can be granted (or none was asked)."""
    names = (requested or "").split()
    if not names:
        raise InvalidScope("The scope parameter is required: ask for system scopes, e.g. system/Patient.rs.")
    try:
        declared = [s for s in smart_scopes.resource_scopes(registered) if s.context == "system"]
    except smart_scopes.ScopeSyntaxError:  # only validated values are stored: a hand edit grants nothing
        declared = []
    granted = []
    for name in names:
        asked = _asked(name)
        if asked is None:
            continue
        scope, v1 = asked
        for narrowed in smart_scopes.grant([scope], declared):
            granted.append(_spelled(narrowed, v1))
    if not granted:
        raise InvalidScope("None of the requested scopes can be granted: this application may ask only the "
                           f"read-only system scopes it registered ({registered or 'none'}).")
    return " ".join(dict.fromkeys(granted))
