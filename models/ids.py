"""Identifiers: the one id grammar, and new random ids and secrets.

`ID` is the only grammar of an id anywhere in svc-auth (an application, clinic, user, request,
patient or FHIR resource id; a path parameter): what we emit (`pat_b15c092f2447b7a2`, `org_…`) and
what EHRs emit (FHIR R4's id, `[A-Za-z0-9\\-.]{1,64}`), i.e. their union, 1 to 64 of letters,
digits, `_`, `-` and `.`, but never `.` or `..` alone (a path segment, not an id). It is always
matched whole (`is_id`: `fullmatch`, so no trailing newline slips through)."""
from __future__ import annotations

import re
import secrets

ID = re.compile(r"(?!\.\.?\Z)[A-Za-z0-9_.\-]{1,64}")
ID_PATTERN = r"^(?!\.\.?$)[A-Za-z0-9_.\-]{1,64}$"
"""The same grammar anchored, for JSON Schema (OpenAPI `pattern` is a search, not a full match)."""
ID_RULE = "1 to 64 letters, digits, '_', '-' or '.' (not '.' or '..' alone)"


def is_id(value) -> bool:
    """Is `value` an id (a string that matches `ID` whole)?"""
    return isinstance(value, str) and ID.fullmatch(value) is not None


def new_id(prefix: str, nbytes: int = 12) -> str:
    """A public identifier such as `org_3k9...`: unguessable but not a secret."""
    return f"{prefix}_{secrets.token_hex(nbytes)}"


def new_secret(nbytes: int = 32) -> str:
    """A bearer secret with `8 * nbytes` bits of randomness (256 by default)."""
    return secrets.token_urlsafe(nbytes)
