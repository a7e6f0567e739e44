"""What svc-auth asks a clinic's EHR for, and what the EHR granted (SMART Backend Services scopes).

svc-auth asks for a `system/` scope for every type the platform FHIR API serves on a FHIR clinic
(`connectors.us_core.SUPPORTED_TYPES`: the schedule's, the charts', every US Core type,
FamilyMemberHistory and Medication), in SMART v1 (`system/{Type}.read`) or v2 (`system/{Type}.rs`)
syntax. An EHR may grant fewer (its registration of svc-auth decides): the token response's
`scope` says which (RFC 6749 5.1: absent means as asked). A type not granted is never asked of the
EHR: the FHIR API answers 403 `forbidden` for it (`NotGranted`), the clinic's CapabilityStatement
leaves it out, and an `_include`/`_revinclude` of it becomes an OperationOutcome entry
(`connectors.fhir.client.NotGranted`). The EHR's own Bulk Data `Patient/$export` needs no other
scope: it is asked only for granted types (`export_types`).
"""
from __future__ import annotations

import re

from connectors.us_core import SUPPORTED_TYPES

NIGHT_TYPES = ("Practitioner", "Appointment", "Patient", "Encounter", "Condition", "Observation",
               "MedicationRequest", "AllergyIntolerance", "DocumentReference")
"""The nine types the night's schedule and the charts read (all an EHR granted before issue 46)."""
REQUESTED_TYPES = tuple(dict.fromkeys(NIGHT_TYPES + SUPPORTED_TYPES))
"""Every type asked for: the night's first, then every type the FHIR API serves."""
_SCOPE = re.compile(r"system/([A-Za-z]+|\*)\.([a-z*]+)")
_V2 = re.compile(r"c?r?u?d?s?")


def requested_scopes(version: str) -> tuple[str, ...]:
    """The `system/` scopes asked for, in SMART v1 (`.read`) or v2 (`.rs`) syntax."""
    suffix = "read" if version == "v1" else "rs"
    return tuple(f"system/{kind}.{suffix}" for kind in REQUESTED_TYPES)


def scope_types(scopes) -> frozenset[str]:
    """The types a list of `system/` scopes lets svc-auth read: v1 `.read`/`.*`, v2 with `r` or `s`;
    `system/*.…` reaches every type asked for."""
    found = set()
    for scope in scopes:
        match = _SCOPE.fullmatch(scope)
        if not match:
            continue
        kind, permission = match.groups()
        readable = permission in ("read", "*") or (_V2.fullmatch(permission) and ("r" in permission or "s" in permission))
        if not readable:
            continue
        found.update(REQUESTED_TYPES if kind == "*" else (kind,))
    return frozenset(found)


def granted_types(token_response: dict, asked: tuple[str, ...]) -> frozenset[str]:
    """The types a token response grants: its `scope` (space-separated), or, without one, what was asked."""
    scope = token_response.get("scope") if isinstance(token_response, dict) else None
    if not isinstance(scope, str):
        return scope_types(asked)
    return scope_types(scope.split())



def export_types(asked, granted: frozenset[str] | None) -> tuple[str, ...]:
    """The types of `asked` svc-auth may name in the `_type` of the EHR's own `Patient/$export`:
    those its token grants (Bulk Data Access IG 2.0.0: a server exports only the types the client's
    `system/` scopes reach; the scopes are the ones asked above, no other). `granted` None: an open
    server, every type."""
    return tuple(t for t in asked if t in REQUESTED_TYPES and (granted is None or t in granted))
