"""What a FHIR API answer discloses: the patients whose compartments its resources are in.

A read or search names every patient its resources belong to (the Patient itself, or the
`Patient/{id}` its subject, patient or participants reference); a failure names the patients it
asked for: the path id of a Patient read, the `patient`/`subject`/`actor` (and a Patient search's
`_id`) values, and the token's patient, in R4's spelling (`models.ids.fhir_id`, as the FHIR API
reads them), so an old `pat_…` in a request is recorded as the patient's id, `pat-…`.
"""
from __future__ import annotations

from audit.disclosures import Disclosure
from models.ids import fhir_id

ASKING = ("patient", "subject", "actor", "patient:Patient", "subject:Patient")


def patients_of(resource: dict) -> list[str]:
    """The patients in whose compartment `resource` is (relative `Patient/{id}` references)."""
    if resource.get("resourceType") == "Patient":
        return [resource["id"]] if isinstance(resource.get("id"), str) else []
    refs = [(resource.get("subject") or {}).get("reference"), (resource.get("patient") or {}).get("reference")]
    refs += [(p.get("actor") or {}).get("reference") for p in resource.get("participant") or () if isinstance(p, dict)]
    return [r.split("/_history/")[0][len("Patient/"):] for r in refs if isinstance(r, str) and r.startswith("Patient/")]


def describe_read(resource: dict):
    return patients_of(resource), [resource.get("id")]


def describe_search(bundle: dict):
    found = [entry.get("resource") or {} for entry in bundle.get("entry") or ()]
    return [p for resource in found for p in patients_of(resource)], [r.get("id") for r in found]


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def asked_patients(resource_type: str, path_id: str | None, raw_args: dict, token_patient: str | None) -> list[str]:
    """The patients a request asked for, from its path and (undecoded) query arguments."""
    asked = [path_id] if resource_type == "Patient" and path_id else []
    names = ASKING + (("_id",) if resource_type == "Patient" else ())
    for name in names:
        for value in raw_args.get(name, ()):
            for item in _text(value).split(","):
                kind, _, ident = item.strip().rpartition("/")
                if kind in ("", "Patient") or kind.endswith("/Patient"):
                    asked.append(ident)
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
        client_id=claims.get("client_id"), user_id=claims.get("sub"), jti=claims.get("jti"), scope=claims.get("scope"),
        source_address=request.source_address, request_id=request.request_id, query=request.query,
        resource_type=resource_type, resource_ids=tuple(asked_ids(path_id, raw_args)),
        patients=tuple(asked_patients(resource_type, path_id, raw_args, caller.patient)))
