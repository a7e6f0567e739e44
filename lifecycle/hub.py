"""What the sandbox hub shows a user: the apps installed in their clinic and whether each opens.

Spec (activation status): an installation with no status yet (its first SDK initialization has
not completed) or `Enabled` can be opened; a `Disabled` one is greyed out and cannot.
`lifecycle.launches.create_launch` enforces the same rule on the server side.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

from connectors.sessions import end_session, touch_session
from lifecycle.sandbox import sandbox_user
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


def hub_heartbeat(runtime, sandbox_token: str | None) -> list[HubEntry]:
    """The open hub's periodic app-list read (`GET /sandbox/api/apps`, Bearer sandbox token).

    A hub that stays open is the user being active in the EHR: it renews their connector session
    (`touch_session` writes at most once a minute however often the hub polls)."""
    user = sandbox_user(runtime, sandbox_token)
    touch_session(user, runtime)
    return hub_entries(user)


def sign_out(runtime, user) -> int:
    """The user signed out of the hub: their connector session ends (the sync stops reading for them)."""
    return end_session(user, runtime)
