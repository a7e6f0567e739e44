"""What the sandbox hub shows a user: the apps installed in their clinic and whether each opens,
and a physician's upcoming appointments, each of which opens an app with that patient in context.

Whether an app opens is `lifecycle.activation.may_open` (a `Disabled` one is greyed out);
`hub.launches.create_launch` asks the same rule on the server side.
"""
from __future__ import annotations

import datetime as dt
import itertools
from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit

from audit.disclosures import ehr_recorder
from connectors import Bounds, ConnectorError, Provider
from schedules import schedule_source
from workers.activity import record_activity
from lifecycle.activation import may_open
from models.application import Application, Installation
from models.directory import User
from oauth.redirects import RedirectUriError, normalise_redirect_uri


def origin_of(url: str) -> str | None:
    """The origin of the page a browser opens at an app's registered `url`, as the browser writes
    it (`event.origin`, a CSP source): read as the browser reads the URL (`\\` as `/`, scheme and
    host in lower case, no default port; `oauth.redirects.normalise_redirect_uri`), so no text of the
    stored URL reaches the hub's CSP header. None for a URL no browser would follow."""
    try:
        parts = urlsplit(normalise_redirect_uri(url))
    except RedirectUriError:
        return None
    return f"{parts.scheme}://{parts.netloc}"


@dataclass(frozen=True)
class HubEntry:
    """One installed app as the hub lists it. Public data only: never a secret."""

    application_id: str
    name: str
    client_id: str
    activation_status: str | None
    openable: bool
    app_origin: str | None   # where the app's page (its manifest redirect_uri) runs: the SDK's postMessage origin
    launch_origin: str | None  # where the launch endpoint runs (framed first)
    token_endpoint: str | None
    app_origins: tuple = ()  # app_origin first, then those of its other exact redirect URIs: each may run the SDK

    def as_dict(self) -> dict:
        return asdict(self)


def redirect_origins(app: Application) -> tuple[str, ...]:
    """The origins of every redirect URI `app` registered, the manifest's first: in `exact` mode an
    app may register several (`Application.redirect_uris`), on several origins, and authorize
    sends the browser to any of them, so the hub frames each and takes the SDK's messages from each."""
    uris = (app.redirect_uri, *(app.redirect_uris or ())) if app.redirect_uri_match == "exact" else (app.redirect_uri,)
    return tuple(dict.fromkeys(o for o in map(origin_of, uris) if o))


def hub_entries(user: User) -> list[HubEntry]:
    rows = (Installation.select(Installation, Application)
            .join(Application)
            .where(Installation.organization == user.organization_id)
            .order_by(Application.name, Application.id))
    return [HubEntry(application_id=row.application.id, name=row.application.name,
                     client_id=row.application.client_id, activation_status=row.activation_status,
                     openable=may_open(row.activation_status),
                     app_origin=origin_of(row.application.redirect_uri),
                     launch_origin=origin_of(row.application.launch_url),
                     token_endpoint=row.application.token_endpoint,
                     app_origins=redirect_origins(row.application))
            for row in rows]


def frame_origins(entries: list[HubEntry]) -> list[str]:
    """Origins the hub may frame: every installed app's launch and redirect (main-page) origins."""
    return list(dict.fromkeys(o for e in entries for o in (e.launch_origin, *e.app_origins) if o))


APPOINTMENT_DAYS = 7      # the hub lists the physician's appointments of the next 7 days
APPOINTMENT_ROWS = 100    # at most this many, the soonest first


@dataclass(frozen=True)
class HubAppointment:
    """One upcoming appointment as the hub lists it: opening an app from its row launches the app
    with this patient in context (`patient_id`: the connector's id, the FHIR Patient id)."""

    start: dt.datetime
    patient_id: str
    patient_name: str
    reason: str
    status: str


def upcoming_appointments(runtime, user: User) -> tuple[list[HubAppointment], str | None]:
    """The physician's appointments from now to `APPOINTMENT_DAYS` ahead, read from the clinic's
    schedule source (`schedules`, as the night reads it: its EHR, or its SIU feed) within
    `Bounds.interactive` (the page answers within `SVC_EHR_INTERACTIVE_DEADLINE`),
    and None; or no rows and what went wrong (the hub still opens apps without them).
    A user without an NPI is not a physician: no appointments. Each fetch is an `ehr.fetch`
    disclosure record naming the user it is shown to (its patients are on the page)."""
    if not user.npi:
        return [], None
    now = runtime.clock.now().replace(tzinfo=None)
    provider = Provider(user_id=user.id, npi=user.npi, name=user.display_name, ehr_username=user.ehr_username)
    try:
        recorder = ehr_recorder(runtime, user.organization_id, user_id=user.id)
        source = schedule_source(runtime, user.organization, Bounds.interactive(runtime.settings), recorder)
        found = source.fetch_appointments(provider, now, now + dt.timedelta(days=APPOINTMENT_DAYS))
        rows = sorted(itertools.islice(found, 2000), key=lambda a: a.start)[:APPOINTMENT_ROWS]
        source.finish_night()   # as the night: Epic refusing every Patient read is an error, not "no appointments"
    except ConnectorError as exc:
        return [], f"The clinic's EHR did not answer: {exc}"
    return [HubAppointment(start=a.start, patient_id=a.patient.id,
                           patient_name=f"{a.patient.first_name} {a.patient.last_name}".strip(),
                           reason=a.reason, status=a.status) for a in rows], None


@dataclass(frozen=True)
class HubView:
    """Everything the hub and settings pages render, read in one blocking call."""

    user: User
    organization: object
    entries: list
    sandbox_token: str
    appointments: list = field(default_factory=list)
    appointments_error: str | None = None


def hub_view(runtime, user_id: str, auth_time: float | None = None, appointments: bool = False) -> HubView:
    """The sandbox user `user_id` with their organization, installed apps and a fresh sandbox token
    (`auth_time`: when the person signed in, epoch seconds); with `appointments`, their upcoming
    appointments too (the hub page)."""
    from hub.sandbox import issue_sandbox_token
    from errors import ApiError
    user = User.with_organization(user_id)
    if user is None:
        raise ApiError(404, "user_not_found", f"No sandbox user has id {user_id!r}.")
    rows, error = upcoming_appointments(runtime, user) if appointments else ([], None)
    return HubView(user, user.organization, hub_entries(user),
                   issue_sandbox_token(runtime, user, auth_time=auth_time), rows, error)


def hub_entries_for_token(runtime, authorization: str | None) -> list[HubEntry]:
    """The hub's app list for the bearer of a sandbox token (`Authorization`; 401 when not valid).

    The open hub re-reads it every few seconds (`GET /sandbox/api/apps`): a hub that stays open is
    the user being active in the EHR, so this renews their connector session (`record_activity`
    writes at most once a minute however often the hub polls)."""
    from hub.sandbox import sandbox_user
    user = sandbox_user(runtime, authorization)
    record_activity(runtime, user)
    return hub_entries(user)

