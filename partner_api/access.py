"""What an application may see: its own id, and organizations where it is installed."""
from __future__ import annotations

import re

from models.application import Application, Installation
from models.directory import Organization
from errors import ApiError

PATH_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def path_id(name: str, value: str) -> str:
    """A path identifier of the shape our ids have, else 400 (never a database lookup of junk)."""
    if not PATH_ID.match(value or ""):
        raise ApiError(400, "invalid_path_parameter",
                       f"{name} must be 1 to 64 letters, digits, '_', '-' or '.', starting with a letter or digit.")
    return value


def own_application(app: Application, application_id: str) -> Application:
    """The caller's own application; another app's id is 403, an unknown id 404."""
    path_id("applicationId", application_id)
    if application_id == app.id:
        return app
    if Application.get_or_none(Application.id == application_id) is None:
        raise ApiError(404, "application_not_found", f"No application has id {application_id!r}.")
    raise ApiError(403, "forbidden", "An application may only read its own applicationId.")


def installation_of(app: Application, organization_id: str, name: str = "organizationId") -> Installation:
    """The app's installation in the organization; unknown org 404, not installed there 403."""
    path_id(name, organization_id)
    installation = Installation.find(app.id, organization_id)
    if installation is not None:
        return installation
    if Organization.get_or_none(Organization.id == organization_id) is None:
        raise ApiError(404, "organization_not_found", f"No organization has id {organization_id!r}.")
    raise ApiError(403, "not_installed", "The application is not installed in this organization.")
