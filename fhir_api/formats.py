"""Content negotiation of the FHIR API: JSON only (`application/fhir+json`).

`_format` may say `json`, `application/json`, `application/fhir+json` or `application/json+fhir`;
any other value, or an Accept header that admits no JSON, is a 406 (with an OperationOutcome in
JSON, the one format there is)."""
from __future__ import annotations

from fhir_api.outcome import FhirError

JSON_FORMATS = frozenset({"json", "application/json", "application/fhir+json", "application/json+fhir"})
JSON_RANGES = frozenset({"*/*", "application/*", "application/json", "application/fhir+json", "application/json+fhir"})


def _accepts_json(accept: str) -> bool:
    for item in accept.split(","):
        media, *params = (part.strip().lower() for part in item.split(";"))
        refused = any(p.replace(" ", "") in ("q=0", "q=0.0", "q=0.00", "q=0.000") for p in params)
        if media in JSON_RANGES and not refused:
            return True
    return False


def check_format(format_values: list[str] | None, accept: str | None) -> None:
    """406 unless the request admits JSON."""
    if format_values:
        if len(format_values) > 1 or format_values[0].strip().lower() not in JSON_FORMATS:
            raise FhirError(406, "not-supported", "Only JSON is served: _format=json (application/fhir+json).")
        return
    if accept and accept.strip() and not _accepts_json(accept):
        raise FhirError(406, "not-supported", "Only application/fhir+json is served; the Accept header admits no JSON.")
