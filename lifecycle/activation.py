"""The application activation status of one installation (spec: States and transitions).

(none) -> Disabled happens at the first completed SDK initialization (`lifecycle.verification`).
After that the application sets `Enabled` or `Disabled` itself; the first `Enabled` starts the
30-day free trial of that installation (`oauth.free_trial`). Every change is audited (it decides billing).
"""
from __future__ import annotations

from oauth.free_trial import start_trial
from models.application import ACTIVATION_STATUSES, Installation
from models.audit import AuditEvent
from errors import ApiError


def set_activation_status(runtime, installation: Installation, status, actor: str) -> Installation:
    if status not in ACTIVATION_STATUSES:
        raise ApiError(400, "invalid_status", f"status must be one of {', '.join(ACTIVATION_STATUSES)}.")
    current = Installation.get_by_id(installation.id)
    if current.activation_status is None:
        raise ApiError(409, "not_initialized",
                       "The activation status can be set only after the application's first SDK initialization "
                       "in this organization.")
    with runtime.db.atomic():
        Installation.update(activation_status=status).where(Installation.id == current.id).execute()
        if status == "Enabled":
            start_trial(current.id, runtime.clock.now())
        AuditEvent.record(actor, "installation.activation_status_set",
                          f"{current.application_id}/{current.organization_id}",
                          before=current.activation_status, after=status)
    return Installation.get_by_id(current.id)
