"""Creating a launch: the host platform opens an installed app for one of its users."""
from __future__ import annotations

from connectors.sessions import touch_session
from models.application import Application, Installation
from models.directory import User
from models.grants import Launch, expiry
from models.ids import new_secret
from errors import ApiError
from oauth.redirects import with_query


def create_launch(runtime, user: User, client_id: str, auth_time: int | None = None) -> tuple[Launch, str]:
    """A new launch of the app `client_id` for `user`, and the app's launch URL to load.
    `auth_time` (epoch seconds): when the user authenticated with the platform (default now).

    Opening an app is activity in the hub: it opens or renews the user's connector session."""
    app = Application.get_or_none(Application.client_id == client_id)
    if app is None:
        raise ApiError(404, "unknown_client", "No application has this client_id.")
    installation = Installation.find(app.id, user.organization_id)
    if installation is None:
        raise ApiError(403, "not_installed", "This application is not installed in the user's organization.")
    if installation.activation_status == "Disabled":
        raise ApiError(403, "application_disabled",
                       "This application is Disabled in this organization and cannot be opened.")
    now = runtime.clock.now()
    launch = Launch.create(id=new_secret(24), application=app.id, user=user.id, organization=user.organization_id,
                           created_at=now, expires_at=expiry(now, runtime.settings.launch_ttl),
                           auth_time=int(runtime.clock.time()) if auth_time is None else auth_time)
    touch_session(runtime, user)
    org = user.organization
    url = with_query(app.launch_url, launch_id=launch.id, svc_organization_id=org.id, ehr_url=org.ehr_url or None)
    return launch, url
