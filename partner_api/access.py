"""What an application may see: its own id, and organizations where it is installed (and, for
the clinic's data, where its status allows use)."""
from __future__ import annotations

from lifecycle import activation
from models.application import Application, Installation
from models.ids import ID_RULE, is_id
from errors import ApiError


def path_id(name: str, value: str) -> str:
    """A path identifier of the shape our ids have, else 400 (never a database lookup of junk)."""
    if not is_id(value):
        raise ApiError(400, "invalid_path_parameter", f"{name} must be {ID_RULE}.")
    return value


def own_application(app: Application, application_id: str) -> Application:
    """The caller's own application; another app's id is 403, an unknown id 404."""
    path_id("applicationId", application_id)
    if application_id == app.id:
        return app
    if Application.get_or_none(Application.id == application_id) is None:
        raise ApiError(404, "application_not_found", f"No application has id {application_id!r}.")
    raise ApiError(403, "forbidden", "An application may only read its own applicationId.")


def installation_of(app: Application, organization_id: str, name: str = "organizationId",
                    purpose: str | None = None) -> Installation:
    """The app's installation in the organization (`lifecycle.activation.installation_of`): unknown
    org 404, not installed there 403; with `purpose` (USE: the clinic's data), Disabled 403."""
    return activation.installation_of(app.id, organization_id, purpose, name)
