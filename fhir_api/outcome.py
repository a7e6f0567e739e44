"""FHIR errors: an `ApiError` whose body is an OperationOutcome (the FHIR API's only error shape)."""
from __future__ import annotations

from errors import ApiError

FHIR_JSON = "application/fhir+json"


def operation_outcome(code: str, diagnostics: str, severity: str = "error") -> dict:
    """An OperationOutcome with one issue (`code`: a FHIR IssueType, e.g. invalid, not-found)."""
    return {"resourceType": "OperationOutcome",
            "issue": [{"severity": severity, "code": code, "diagnostics": diagnostics}]}


class FhirError(ApiError):
    """A FHIR API error: HTTP status, FHIR issue code and a message; renders as an OperationOutcome."""

    def __init__(self, status: int, issue_code: str, message: str, headers: dict | None = None):
        super().__init__(status, issue_code, message, headers)

    def body(self) -> dict:
        return operation_outcome(self.error, self.message)


def invalid(message: str) -> FhirError:
    return FhirError(400, "invalid", message)


def not_found(resource_type: str, resource_id: str) -> FhirError:
    return FhirError(404, "not-found", f"No {resource_type} {resource_id!r} here.")
