"""Identifiers: the one id grammar, and new random ids and secrets.

`ID` is the only grammar of an id anywhere in svc-auth (an application, clinic, user, request,
patient or FHIR resource id; a path parameter): what we emit (`org_…`, `usr_…`; the sandbox's
`pat-b15c092f2447b7a2`) and what EHRs emit (FHIR R4's id, `[A-Za-z0-9\\-.]{1,64}`), i.e. their
union, 1 to 64 of letters, digits, `_`, `-` and `.`, but never `.` or `..` alone (a path segment,
not an id). It is always matched whole (`is_id`: `fullmatch`, so no trailing newline slips through).

What the FHIR API serves is R4's id type (`R4_ID`): the sandbox makes its ids with `sandbox_id`
(`pat-b15c092f2447b7a2`, `enc-{hex}-3`) and shows a user id as `fhir_id(user.id)` (`usr-…`). Ids
before issue 35 spelled `_` where R4 has `-` (`pat_b15c092f2447b7a2`); R4 ids never hold `_`, so
`fhir_id` is the one normaliser of an id a request names: the old spelling names the same resource.
`id_spellings` gives both spellings, for records written before (the append-only disclosure audit)."""
from __future__ import annotations

import re
import secrets

ID = re.compile(r"(?!\.\.?\Z)[A-Za-z0-9_.\-]{1,64}")
ID_PATTERN = r"^(?!\.\.?$)[A-Za-z0-9_.\-]{1,64}$"
"""The same grammar anchored, for JSON Schema (OpenAPI `pattern` is a search, not a full match)."""
ID_RULE = "1 to 64 letters, digits, '_', '-' or '.' (not '.' or '..' alone)"
R4_ID = re.compile(r"[A-Za-z0-9\-.]{1,64}")
"""FHIR R4's `id` type: what the FHIR API serves (matched whole)."""


def is_id(value) -> bool:
    """Is `value` an id (a string that matches `ID` whole)?"""
    return isinstance(value, str) and ID.fullmatch(value) is not None


def fhir_id(value: str) -> str:
    """The R4 spelling of an id (`_` swapped for `-`): `pat_b15c…` -> `pat-b15c…`, `usr_demo` ->
    `usr-demo`. An id that is R4 already (every EHR's) is unchanged."""
    return value.replace("_", "-")


def sandbox_id(kind: str, *parts) -> str:
    """A sandbox EHR id, R4's type: `kind-part-...` (`sandbox_id("pat", "b15c…")` = `pat-b15c…`)."""
    return fhir_id("-".join((kind, *map(str, parts))))


def id_spellings(value: str) -> tuple[str, ...]:
    """`value` as a request may name it and as records written before issue 35 hold it: the R4
    spelling first, then the one with `_` (a sandbox id's), without repeats."""
    return tuple(dict.fromkeys((fhir_id(value), value.replace("-", "_"), value)))


def new_id(prefix: str, nbytes: int = 12) -> str:
    """A public identifier such as `org_3k9...`: unguessable but not a secret."""
    return f"{prefix}_{secrets.token_hex(nbytes)}"


def new_secret(nbytes: int = 32) -> str:
    """A bearer secret with `8 * nbytes` bits of randomness (256 by default)."""
    return secrets.token_urlsafe(nbytes)
