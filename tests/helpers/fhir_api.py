"""The platform FHIR API under test: over HTTP (`Fhir`; tokens: `helpers.tokens.mint_platform_token`),
and in-process (`fhir_caller`)."""
from __future__ import annotations

import json
import urllib.parse

from helpers.http import http

ALL_TYPES = ("AllergyIntolerance", "Appointment", "CarePlan", "CareTeam", "Condition", "Coverage", "Device",
             "DiagnosticReport", "DocumentReference", "Encounter", "FamilyMemberHistory", "Goal", "Immunization",
             "Location", "Medication", "MedicationDispense", "MedicationRequest", "Observation", "Organization", "Patient",
             "Practitioner", "PractitionerRole", "Procedure", "Provenance", "QuestionnaireResponse", "RelatedPerson",
             "ServiceRequest", "Specimen")
"""US Core 6.1's types, FamilyMemberHistory and Appointment."""


class Fhir:
    """GETs against one clinic's FHIR base with one token: (status, headers, JSON body)."""

    def __init__(self, live: str, org_id: str, token: str | None):
        self.base = f"{live}/fhir/r4/{org_id}"
        self.token = token

    def get(self, path: str, params: dict | list | None = None, headers: dict | None = None, raw_path: bool = False):
        url = path if path.startswith("http") else self.base + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        sent = {"Accept": "application/fhir+json"}
        if self.token:
            sent["Authorization"] = f"Bearer {self.token}"
        sent.update(headers or {})
        status, response_headers, body = http("GET", url, None, sent)
        try:
            payload = json.loads(body) if body else None
        except ValueError:
            payload = body
        return status, response_headers, payload

    def post_search(self, resource_type: str, form, content_type: str = "application/x-www-form-urlencoded",
                    query: str = ""):
        """`POST {base}/{Type}/_search` with `form` (a dict or list of pairs; or bytes as sent):
        (status, headers, JSON body)."""
        body = form if isinstance(form, bytes) else urllib.parse.urlencode(form).encode()
        sent = {"Accept": "application/fhir+json", "Content-Type": content_type}
        if self.token:
            sent["Authorization"] = f"Bearer {self.token}"
        status, headers, raw = http("POST", f"{self.base}/{resource_type}/_search" + (f"?{query}" if query else ""),
                                    body, sent)
        return status, headers, json.loads(raw) if raw else None

    def ok(self, path: str, params=None) -> dict:
        status, headers, body = self.get(path, params)
        assert status == 200, (path, params, body)
        assert headers["Content-Type"].startswith("application/fhir+json"), headers["Content-Type"]
        return body

    def search(self, resource_type: str, params=None) -> dict:
        bundle = self.ok(f"/{resource_type}", params)
        assert bundle["resourceType"] == "Bundle" and bundle["type"] == "searchset", bundle
        return bundle


def resources(bundle: dict) -> list[dict]:
    return [entry["resource"] for entry in bundle.get("entry", ())]


def outcome(body) -> str:
    """The first issue's code of an OperationOutcome (asserting it is one)."""
    assert isinstance(body, dict) and body.get("resourceType") == "OperationOutcome", body
    return body["issue"][0]["code"]


def fhir_caller(runtime, token: str, organization_id: str):
    """The FHIR API's caller of `token` on clinic `organization_id`, as the API authenticates it (or
    its refusal: an `errors.ApiError`). The one place tests build a caller of `fhir_api.api`."""
    from fhir_api.access import authenticate
    return authenticate(runtime, f"Bearer {token}", organization_id)
