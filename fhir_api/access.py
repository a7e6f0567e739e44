"""Who may read what through the FHIR API: the bearer token, its clinic, its app and its scopes.

- The token: a live platform access token (`oauth.resource.active_user_token`: signature, expiry,
  deny-list); none -> 401 without an error code (RFC 6750 3.1), a bad one -> 401 `invalid_token`.
- The clinic: the token's `org` must be the path's, else 404 (another clinic is never revealed).
- The app and the user: the token's `client_id` and `sub` must still exist (the user still in
  the clinic), else 401; the app must be installed in the clinic and not `Disabled` there, else 403.
- The scopes: `oauth.smart_scopes.access` on the token's `scope` and on the app's current
  `smart_scopes` (what it declares now: narrowing them takes effect at once); `r` read, `s` search.
  A `patient/` scope limits access to the token's `patient` (its compartment).
"""
from __future__ import annotations

from dataclasses import dataclass

from connectors import matching
from fhir_api.outcome import FhirError
from models.application import Installation
from models.directory import User
from oauth.resource import active_user_token, bearer_value
from oauth.smart_scopes import ScopeSyntaxError, access

REALM = "svc-auth"
PATIENT_COMPARTMENT_FREE = ("Practitioner",)
"""Types outside any patient's compartment (the clinic's directory): a `patient/` scope reads them all."""


@dataclass(frozen=True)
class Caller:
    """A verified caller: its token's claims, its application, and its clinic."""

    claims: dict
    app: object
    organization_id: str

    @property
    def patient(self) -> str | None:
        value = self.claims.get("patient")
        return value if isinstance(value, str) and value else None


@dataclass(frozen=True)
class Grant:
    """What a caller may do with one type: `patient` set = only that patient's resources."""

    patient: str | None = None


def authenticate(runtime, authorization: str | None, organization_id: str) -> Caller:
    """The caller of a FHIR request on clinic `organization_id`, or the 401/403/404."""
    token = bearer_value(authorization)
    if not token:
        raise FhirError(401, "login", "A Bearer access token is required: Authorization: Bearer <access_token>.",
                        {"WWW-Authenticate": f'Bearer realm="{REALM}"'})
    claims = active_user_token(runtime, token)
    if claims is None:
        raise FhirError(401, "login", "The access token is invalid, expired or revoked.",
                        {"WWW-Authenticate": f'Bearer realm="{REALM}", error="invalid_token", '
                                             f'error_description="The access token is invalid, expired or revoked."'})
    if claims.get("org") != organization_id:
        raise FhirError(404, "not-found", "No such FHIR base.")
    app = runtime.applications.by_client_id(claims.get("client_id"))
    user = User.with_organization(claims.get("sub"))
    if app is None or user is None or user.organization_id != organization_id:
        raise FhirError(401, "login", "The access token's application or user no longer exists here.",
                        {"WWW-Authenticate": f'Bearer realm="{REALM}", error="invalid_token"'})
    installation = Installation.find(app.id, organization_id)
    if installation is None:
        raise FhirError(403, "forbidden", "The application is not installed in this clinic.")
    if installation.activation_status == "Disabled":
        raise FhirError(403, "forbidden", "The application is Disabled in this clinic.")
    return Caller(claims=claims, app=app, organization_id=organization_id)


def grant_for(caller: Caller, resource_type: str, permission: str) -> Grant:
    """What `caller` may do (`r` read, `s` search) with `resource_type`, or 403."""
    verb = "read" if permission == "r" else "search"
    try:
        by_token = access(caller.claims.get("scope"), resource_type, permission)
        by_app = access(caller.app.smart_scopes, resource_type, permission)
    except ScopeSyntaxError:
        by_token = by_app = None
    if not (by_token and by_token.allowed and by_app and by_app.allowed):
        raise FhirError(403, "forbidden", f"The token's scopes do not allow {verb} of {resource_type} "
                                          f"(needs patient/{resource_type}.{permission} or user/{resource_type}.{permission}).")
    if (by_token.patient_only or by_app.patient_only) and resource_type not in PATIENT_COMPARTMENT_FREE:
        if caller.patient is None:
            raise FhirError(403, "forbidden", "A patient/ scope needs a launch with a patient context.")
        return Grant(patient=caller.patient)
    return Grant()


def in_compartment(resource: dict, patient_id: str) -> bool:
    """Is `resource` the patient, or does it name them as its patient (subject, patient, a
    participant) by `Patient/{id}`, versioned or not? The one matcher's rule
    (`connectors.matching.in_compartment`) with no EHR base: a connector makes its EHR's absolute
    references relative, so an absolute URL left is another server's patient, not this one."""
    return matching.in_compartment(resource, patient_id)
