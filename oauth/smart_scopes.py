"""SMART App Launch 2.2 scopes: the launch scopes, and resource scopes (`patient/…`, `user/…`,
`system/…`): parse, grant, enforce.

The launch scopes (`LAUNCH_SCOPES`: `launch`, `launch/patient`) are the only ones that let a token
carry the launch's context (its patient); `oauth.scopes` grants them as declared.

A resource scope is `<context>/<Type or *>.<permissions>`: context `patient` (the launch's patient
only), `user` (whatever the user may see in the clinic) or `system`; permissions are SMART v2
letters in the order `c r u d s` (read = `r`, search = `s`), or SMART v1 `read` (= `rs`), `write`
(= `cud`) and `*` (= `cruds`). Granular scopes (`?param=value`) are not supported.

Granting never widens: a requested scope is granted only as far as a declared scope covers it
(same or wider context, same type or `*`, the permissions both name).
"""
from __future__ import annotations

from types import MappingProxyType

import functools
import re
from dataclasses import dataclass

from models.fhir_grammar import RESOURCE_TYPE

LAUNCH_SCOPES = ("launch", "launch/patient")
"""SMART: the scopes that let a token carry the launch's context (its patient)."""
PERMISSION_ORDER = "cruds"
V1_PERMISSIONS = MappingProxyType({"read": "rs", "write": "cud", "*": "cruds"})
CONTEXTS = ("patient", "user", "system")
# A declared context covers a requested one when it is at least as wide.
_COVERS = MappingProxyType({"system": frozenset({"system", "user", "patient"}), "user": frozenset({"user", "patient"}),
                             "patient": frozenset({"patient"})})
_SCOPE = re.compile(rf"(patient|user|system)/(\*|{RESOURCE_TYPE.pattern})\.(read|write|\*|c?r?u?d?s?)")


class ScopeSyntaxError(ValueError):
    """Not a resource scope this server understands; the message names it."""


@dataclass(frozen=True)
class ResourceScope:
    context: str        # patient | user | system
    resource_type: str  # a FHIR type, or "*"
    permissions: str    # a subset of "cruds", in that order

    def __str__(self) -> str:
        return f"{self.context}/{self.resource_type}.{self.permissions}"


def is_resource_scope(name: str) -> bool:
    """True for anything shaped like a resource scope (`x/y.z`), valid or not."""
    return "/" in name and name.split("/", 1)[0] in CONTEXTS


def parse(name: str) -> ResourceScope:
    """One resource scope; raises ScopeSyntaxError for an unknown shape or an empty permission set."""
    match = _SCOPE.fullmatch(name)
    if not match or "?" in name:
        raise ScopeSyntaxError(f"{name!r} is not a SMART resource scope (context/Type.permissions, e.g. "
                               f"patient/Patient.rs).")
    context, resource_type, permissions = match.groups()
    permissions = V1_PERMISSIONS.get(permissions, permissions)
    if not permissions:
        raise ScopeSyntaxError(f"{name!r} names no permission.")
    return ResourceScope(context, resource_type, permissions)


def parse_or_none(name: str) -> ResourceScope | None:
    """`parse(name)`, or None for anything that is not a resource scope this server understands."""
    if not is_resource_scope(name):
        return None
    try:
        return parse(name)
    except ScopeSyntaxError:
        return None


def resource_scopes(scope: str | None) -> list[ResourceScope]:
    """The resource scopes in a space-separated scope string; other names are skipped."""
    return [parse(n) for n in (scope or "").split() if is_resource_scope(n)]


def _narrowed(requested: ResourceScope, declared: ResourceScope) -> ResourceScope | None:
    """What of `requested` the `declared` scope allows, or None."""
    if requested.context not in _COVERS[declared.context]:
        return None
    if declared.resource_type == "*":
        resource_type = requested.resource_type
    elif requested.resource_type in ("*", declared.resource_type):
        resource_type = declared.resource_type
    else:
        return None
    permissions = "".join(p for p in PERMISSION_ORDER if p in requested.permissions and p in declared.permissions)
    return ResourceScope(requested.context, resource_type, permissions) if permissions else None


def grant(requested: list[ResourceScope], declared: list[ResourceScope]) -> list[ResourceScope]:
    """The requested resource scopes as far as the declared ones allow, without duplicates."""
    granted: dict[str, ResourceScope] = {}
    for want in requested:
        for have in declared:
            narrowed = _narrowed(want, have)
            if narrowed is not None:
                granted.setdefault(str(narrowed), narrowed)
    return list(granted.values())


@dataclass(frozen=True)
class Access:
    """What a token may do with one resource type: `patient_only` limits it to the launch patient."""

    allowed: bool
    patient_only: bool = False


@functools.lru_cache(maxsize=4096)
def access(scope: str | None, resource_type: str, permission: str) -> Access:
    """May a token with `scope` use `permission` (`r` read, `s` search) on `resource_type`?
    A `user/` or `system/` scope allows it in the whole clinic; a `patient/` scope only within the
    launch patient's compartment. Remembered per process (a pure function of its arguments: every
    FHIR request asks it for its token's and its app's scopes)."""
    contexts = {s.context for s in resource_scopes(scope)
                if s.resource_type in ("*", resource_type) and permission in s.permissions}
    if contexts & {"user", "system"}:
        return Access(True)
    if "patient" in contexts:
        return Access(True, patient_only=True)
    return Access(False)
