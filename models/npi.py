"""National Provider Identifiers: the one NPI grammar and the one NPI system URI.

An NPI is exactly ten ASCII digits (`0-9`, never `\\d`, which also takes Arabic-Indic and other
Unicode digits), always matched whole (`is_npi`: `fullmatch`, so no trailing newline slips
through). A user's NPI is how the FHIR connector finds their Practitioner in the clinic's EHR
(`identifier={NPI_SYSTEM}|{npi}`): a value the EHR could never hold must be refused when it is
set, not found missing at sign-in (the user would silently get no `fhirUser`)."""
from __future__ import annotations

import re

NPI_SYSTEM = "http://hl7.org/fhir/sid/us-npi"
"""The FHIR identifier system of an NPI (US Core Practitioner.identifier)."""
NPI = re.compile(r"[0-9]{10}")
NPI_PATTERN = rf"^{NPI.pattern}$"
"""The same grammar anchored, for JSON Schema (OpenAPI `pattern` is a search, not a full match)."""


def is_npi(value) -> bool:
    """Is `value` an NPI (a string that matches `NPI` whole)?"""
    return isinstance(value, str) and NPI.fullmatch(value) is not None
