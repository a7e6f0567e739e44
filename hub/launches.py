"""Creating a launch: the host platform opens an installed app for one of its users, optionally
with a patient in context (SMART `launch/patient`)."""
from __future__ import annotations

from workers.activity import record_activity
from lifecycle.activation import OPEN, require
from models.application import Application, Installation
from models.directory import User
from models.grants import Launch, expiry
from models.ids import ID_RULE, fhir_id, is_id, new_secret
from errors import ApiError
from oauth.redirects import with_query


def valid_patient_id(value) -> str | None:
    """`value` in R4's spelling (`models.ids.fhir_id`) when it is an id (`models.ids`: the grammar
    the FHIR API reads the patient by, so a launch never carries a patient the FHIR API would
    refuse), None when absent; 400 otherwise."""
    if value is None:
        return None
    if not is_id(value):
        raise ApiError(400, "invalid_request", f"patient_id must be a patient id: {ID_RULE}.")
    return fhir_id(value)


def create_launch(runtime, user: User, client_id: str, auth_time: int | None = None,
                  patient_id: str | None = None) -> tuple[Launch, str]:
    """A new launch of the app `client_id` for `user`, and the app's launch URL to load.
    `auth_time` (epoch seconds): when the user authenticated with the platform (default now).
    `patient_id`: the patient in context (the token response's `patient`), if any. The URL carries
    the spec's `launch_id`, `svc_organization_id` and `ehr_url`, and SMART's `launch` and `iss`.

    Opening an app is activity in the hub: it opens or renews the user's connector session."""
    app = Application.get_or_none(Application.client_id == client_id)
    if app is None:
        raise ApiError(404, "unknown_client", "No application has this client_id.")
    require(Installation.find(app.id, user.organization_id), OPEN)
    patient_id = valid_patient_id(patient_id)
    now = runtime.clock.now()
    launch = Launch.create(id=new_secret(24), application=app.id, user=user.id, organization=user.organization_id,
                           created_at=now, expires_at=expiry(now, runtime.settings.launch_ttl),
                           auth_time=int(runtime.clock.time()) if auth_time is None else auth_time,
                           patient_id=patient_id)
    record_activity(runtime, user)
    org = user.organization
    url = with_query(app.launch_url, launch_id=launch.id, svc_organization_id=org.id, ehr_url=org.ehr_url or None,
                     launch=launch.id, iss=runtime.fhir_base_url(org.id))
    return launch, url
