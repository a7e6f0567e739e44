"""Who may read what through the FHIR API: the bearer token, its clinic, its app and its scopes.

- The token, its clinic, its app and user: the FHIR API's `BearerGate` (`oauth.bearer`): a live
  platform access token (none -> 401 without an error code, RFC 6750 3.1; a bad one -> 401
  `invalid_token`); the token's `org` must be the path's, else 404 (another clinic is never
  revealed); its app and user must still exist (the user still in the clinic), else 401; the app
  must be installed in the clinic and its status allow use (`lifecycle.activation`), else 403.
- A backend app's system token: `fhir_api.system_access` (its gate, its `SystemCaller`).
- The scopes: `oauth.smart_scopes.access` on the token's `scope` and on the app's current
  `smart_scopes` (what it declares now: narrowing them takes effect at once; a system token: its
  registered `system_scopes`); `r` read, `s` search.
  A `patient/` scope limits access to the token's `patient` (its compartment) for the types of
  the Patient compartment (`connectors.compartment`); the others (the clinic's directory:
  Practitioner, Organization, Location, Medication...) it reads whole, except the types that list
  patients (`PATIENT_LISTS`: Group), which it does not reach at all (403).
- The user themself (`read_grant`): a token granted `fhirUser` (and an app that still declares it)
  reads the one Practitioner its `fhirUser` claim names without a Practitioner scope (SMART: "permission
  to retrieve information about the current logged-in user"); nothing else (another Practitioner, a
  search, an `_include`) widens.
"""
from __future__ import annotations

from dataclasses import dataclass

from connectors import compartment
from connectors.compartment import in_patient_compartment
from fhir_api.outcome import FhirError
from oauth.bearer import BearerGate, Caller, insufficient_scope, known_user, own_clinic, usable_installation
from oauth.smart_scopes import ScopeSyntaxError, access
from oauth.tokens import PLATFORM_AUDIENCE
from fhir_api.system_access import SYSTEM_FHIR_API, presents_system_token


FHIR_USER = "fhirUser"
"""The SMART scope of the current user's identity: a token granted it reads its own `fhirUser`."""

PATIENT_LISTS = ("Group",)
"""Types outside the Patient compartment whose resources list patients (a Group: the clinic's, a
physician's): a `patient/` grant would read other patients in them, so it does not reach them."""

FHIR_API = BearerGate(PLATFORM_AUDIENCE, requirements=(own_clinic, known_user, usable_installation))
"""The FHIR API's gate: userinfo's, and the path's clinic must be the token's."""


@dataclass(frozen=True)
class Grant:
    """What a caller may do with one type: `patient` set = only that patient's resources."""

    patient: str | None = None


def authenticate(runtime, authorization: str | None, organization_id: str) -> Caller:
    """The caller of a FHIR request on clinic `organization_id`, or the 401/403/404: a launch's
    token (`Caller`), or a backend app's system token (`fhir_api.system_access.SystemCaller`)."""
    gate = SYSTEM_FHIR_API if presents_system_token(authorization) else FHIR_API
    return gate.caller(runtime, authorization, organization_id=organization_id)


def _accesses(caller: Caller, resource_type: str, permission: str):
    """(the token's, the app's) `oauth.smart_scopes.Access` to `resource_type`, or (None, None)."""
    try:
        return (access(caller.claims.get("scope"), resource_type, permission),
                access(caller.declared_scopes, resource_type, permission))  # a system token: its system scopes
    except ScopeSyntaxError:
        return None, None


def patient_scoped(caller: Caller, resource_type: str, permission: str) -> bool:
    """Does `caller` reach `resource_type` (`r` read, `s` search) only through a `patient/` scope
    (its token's or its app's), whether or not the type is in the Patient compartment?"""
    by_token, by_app = _accesses(caller, resource_type, permission)
    return bool(by_token and by_token.allowed and by_app and by_app.allowed
                and (by_token.patient_only or by_app.patient_only))


def own_practitioner(caller: Caller, base: str) -> str | None:
    """The id of the Practitioner the token's `fhirUser` names on the clinic's FHIR base `base`, when
    the token's scope and its app's declared scopes both grant `fhirUser`, else None."""
    reference = caller.claims.get("fhirUser")
    if not isinstance(reference, str) or FHIR_USER not in (caller.claims.get("scope") or "").split():
        return None
    if FHIR_USER not in (caller.declared_scopes or "").split():
        return None
    prefix = f"{base}/Practitioner/"
    if not reference.startswith(prefix):
        return None
    return reference[len(prefix):] or None


def read_grant(caller: Caller, resource_type: str, ident: str, base: str) -> Grant:
    """`grant_for(caller, resource_type, "r")`, except that the user's own Practitioner (`fhirUser`,
    `own_practitioner`) is readable with the `fhirUser` scope alone."""
    if resource_type == "Practitioner" and ident == own_practitioner(caller, base):
        return Grant()
    return grant_for(caller, resource_type, "r")


def grant_for(caller: Caller, resource_type: str, permission: str) -> Grant:
    """What `caller` may do (`r` read, `s` search) with `resource_type`, or 403."""
    verb = "read" if permission == "r" else "search"
    by_token, by_app = _accesses(caller, resource_type, permission)
    if not (by_token and by_token.allowed and by_app and by_app.allowed):
        if getattr(caller, "is_system", False):
            raise insufficient_scope(f"The token's scopes do not allow {verb} of {resource_type} (needs "
                                     f"system/{resource_type}.{permission}, granted and registered).",
                                     scope=f"system/{resource_type}.{permission}")
        raise insufficient_scope(f"The token's scopes do not allow {verb} of {resource_type} (needs "
                                 f"patient/{resource_type}.{permission} or user/{resource_type}.{permission}).",
                                 scope=f"patient/{resource_type}.{permission} user/{resource_type}.{permission}")
    patient_only = by_token.patient_only or by_app.patient_only
    if patient_only and resource_type in PATIENT_LISTS:
        raise FhirError(403, "forbidden", f"A patient/ scope does not reach {resource_type}: a {resource_type} lists "
                                          f"other patients (it needs user/{resource_type}.{permission} or "
                                          f"system/{resource_type}.{permission}).")
    if patient_only and in_patient_compartment(resource_type):
        if caller.patient is None:
            raise FhirError(403, "forbidden", "A patient/ scope needs a launch with a patient context.")
        return Grant(patient=caller.patient)
    return Grant()


def in_compartment(resource: dict, patient_id: str) -> bool:
    """Is `resource` the patient, or in their compartment (`connectors.compartment`: R4's
    CompartmentDefinition), by `Patient/{id}`, versioned or not? No EHR base: a connector makes
    its EHR's absolute references relative, so an absolute URL left is another server's patient."""
    return compartment.in_compartment(resource, patient_id)
