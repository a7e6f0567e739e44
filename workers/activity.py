"""Physician activity in the hub (stored as connector sessions): while it is live, the nightly sync may read for them.

The platform opens or renews a user's session whenever they are active in the hub
(`record_activity`): signing in (`hub.sandbox.open_sandbox_session`), opening an app (`hub.launches.create_launch`),
the platform verifying an app's token (`lifecycle.verification.record_platform_verification`), and
the hub staying open (its app-list poll, `hub.view.hub_entries_for_token`). Signing out ends it
(`end_activity`, via `hub.sandbox.end_sandbox_session`: `POST /sandbox/signout`). A session is active from its start until it ends
or until it has not been seen for `SVC_CONNECTOR_SESSION_TTL` seconds.
"""
from __future__ import annotations

import datetime as dt

from models.appointments import ConnectorSession

HEARTBEAT_SECONDS = 60
"""A session seen less than this ago is not written again (the hub polls every few seconds)."""


def _user_id(user) -> str:
    return user if isinstance(user, str) else user.id


def record_activity(runtime, user) -> ConnectorSession:
    """The user is active in the hub: extend their active connector session, or start a new one.

    A session already seen within `HEARTBEAT_SECONDS` (or a tenth of the lifetime, if shorter)
    is left as it is, so frequent activity costs one read, not a write per call."""
    now = runtime.clock.now()
    ttl = runtime.settings.connector_session_ttl
    since = now - dt.timedelta(seconds=ttl)
    session = (ConnectorSession.select()
               .where((ConnectorSession.user == _user_id(user)) & ConnectorSession.ended_at.is_null()
                      & (ConnectorSession.last_seen_at >= since))
               .order_by(ConnectorSession.last_seen_at.desc()).first())
    if session is None:
        return ConnectorSession.create(user=_user_id(user), started_at=now, last_seen_at=now)
    if now - session.last_seen_at >= dt.timedelta(seconds=min(HEARTBEAT_SECONDS, ttl / 10)):
        ConnectorSession.update(last_seen_at=now).where(ConnectorSession.id == session.id).execute()
        session.last_seen_at = now
    return session


def end_activity(runtime, user) -> int:
    """The user signed out: end their open sessions. Returns how many ended."""
    return (ConnectorSession.update(ended_at=runtime.clock.now())
            .where((ConnectorSession.user == _user_id(user)) & ConnectorSession.ended_at.is_null())
            .execute())


def active_during(start: dt.datetime, end: dt.datetime, ttl: int):
    """Peewee condition: the session was active at some moment of [start, end]."""
    return ((ConnectorSession.started_at <= end)
            & (ConnectorSession.last_seen_at >= start - dt.timedelta(seconds=ttl))
            & (ConnectorSession.ended_at.is_null() | (ConnectorSession.ended_at >= start)))
