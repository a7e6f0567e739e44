"""What the sandbox hub shows a user: the apps installed in their clinic and whether each opens.

Spec (activation status): an installation with no status yet (its first SDK initialization has
not completed) or `Enabled` can be opened; a `Disabled` one is greyed out and cannot.
`lifecycle.launches.create_launch` enforces the same rule on the server side.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

from connectors.sessions import touch_session
from models.application import Application, Installation
from models.directory import User


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def is_openable(activation_status: str | None) -> bool:
    return activation_status != "Disabled"


@dataclass(frozen=True)
class HubEntry:
    """One installed app as the hub lists it. Public data only: never a secret."""

    application_id: str
    name: str
    client_id: str
    activation_status: str | None
    openable: bool
    app_origin: str          # where the app's page (redirect_uri) runs: the SDK's postMessage origin
    launch_origin: str       # where the launch endpoint runs (framed first)
    token_endpoint: str | None

    def as_dict(self) -> dict:
        return asdict(self)


def hub_entries(user: User) -> list[HubEntry]:
    rows = (Installation.select(Installation, Application)
            .join(Application)
            .where(Installation.organization == user.organization_id)
            .order_by(Application.name, Application.id))
    return [HubEntry(application_id=row.application.id, name=row.application.name,
                     client_id=row.application.client_id, activation_status=row.activation_status,
                     openable=is_openable(row.activation_status),
                     app_origin=origin_of(row.application.redirect_uri),
                     launch_origin=origin_of(row.application.launch_url),
                     token_endpoint=row.application.token_endpoint)
            for row in rows]


def frame_origins(entries: list[HubEntry]) -> list[str]:
    """Origins the hub may frame: every installed app's launch and main-page origins."""
    return list(dict.fromkeys(o for e in entries for o in (e.launch_origin, e.app_origin)))


@dataclass(frozen=True)
class HubView:
    """Everything the hub and settings pages render, read in one blocking call."""

    user: User
    organization: object
    entries: list
    sandbox_token: str


def hub_view(runtime, user_id: str, auth_time: float | None = None) -> HubView:
    """The sandbox user `user_id` with their organization, installed apps and a fresh sandbox token
    (`auth_time`: when the person signed in, epoch seconds)."""
    from lifecycle.sandbox import issue_sandbox_token
    from errors import ApiError
    user = User.with_organization(user_id)
    if user is None:
        raise ApiError(404, "user_not_found", f"No sandbox user has id {user_id!r}.")
    return HubView(user, user.organization, hub_entries(user),
                   issue_sandbox_token(runtime, user, auth_time=auth_time))


def hub_entries_for_token(runtime, token: str | None) -> list[HubEntry]:
    """The hub's app list for the bearer of a sandbox token (401 when the token is not valid).

    The open hub re-reads it every few seconds (`GET /sandbox/api/apps`): a hub that stays open is
    the user being active in the EHR, so this renews their connector session (`touch_session`
    writes at most once a minute however often the hub polls)."""
    from lifecycle.sandbox import sandbox_user
    user = sandbox_user(runtime, token)
    touch_session(runtime, user)
    return hub_entries(user)

