"""What a FHIR API answer discloses: the patients whose compartments its resources are in.

A read or search names every patient its resources belong to (`connectors.compartment`: the
Patient itself, or the `Patient/{id}` its compartment's elements reference); a failure names the
patients it asked for: the path id of a Patient read, the values of the type's compartment
parameters (and a Patient search's `_id`), and the token's patient, in R4's spelling
(`models.ids.fhir_id`, as the FHIR API reads them), so an old `pat_…` in a request is recorded as the
patient's id, `pat-…`.
"""
from __future__ import annotations

from audit.disclosures import Disclosure
from connectors.compartment import asked_patients as asked_in_search, patients_of
from models.ids import fhir_id


def describe_read(resource: dict):
    return patients_of(resource), [resource.get("id")]


def describe_search(bundle: dict):
    found = [entry.get("resource") or {} for entry in bundle.get("entry") or ()
             if (entry.get("search") or {}).get("mode") != "outcome"]  # an OperationOutcome is no patient data
    return [p for resource in found for p in patients_of(resource)], [r.get("id") for r in found]


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def asked_patients(resource_type: str, path_id: str | None, raw_args: dict, token_patient: str | None) -> list[str]:
    """The patients a request asked for, from its path and (undecoded) query arguments (the
    compartment's parameters of the type: `connectors.compartment.asked_patients`)."""
    asked = [path_id] if resource_type == "Patient" and path_id else []
    asked += asked_in_search(resource_type, {name: [_text(v) for v in values] for name, values in raw_args.items()})
    return [fhir_id(p) for p in asked] + ([token_patient] if token_patient else [])


def asked_ids(path_id: str | None, raw_args: dict) -> list[str]:
    if path_id:
        return [fhir_id(path_id)]
    return [fhir_id(item) for value in raw_args.get("_id", ()) for item in _text(value).split(",") if item]


def fhir_disclosure(caller, action: str, resource_type: str, path_id: str | None, raw_args: dict,
                    request: Disclosure) -> Disclosure:
    """`request` (the handler's request-level fields) completed with the token's and the ask's."""
    claims = caller.claims
    return Disclosure(
        action=action, organization_id=caller.organization_id, application_id=caller.app.id,
        client_id=claims.get("client_id"), user_id=caller.user_id, jti=claims.get("jti"), scope=claims.get("scope"),
        source_address=request.source_address, request_id=request.request_id, query=request.query,
        resource_type=resource_type, resource_ids=tuple(asked_ids(path_id, raw_args)),
        patients=tuple(asked_patients(resource_type, path_id, raw_args, caller.patient)))
