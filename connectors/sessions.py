"""Connector sessions: when a physician's EHR session is live, the nightly sync may read for them.

The sandbox hub calls `touch_session(runtime, user)` each time a user opens it. A session stays active
until `end_session` or until it has not been seen for `SVC_CONNECTOR_SESSION_TTL` seconds.
"""
from __future__ import annotations

import datetime as dt

from models.appointments import ConnectorSession

def _user_id(user) -> str:
    return user if isinstance(user, str) else user.id


def touch_session(runtime, user) -> ConnectorSession:
    """The user opened the hub: extend their active connector session, or start a new one."""
    now = runtime.clock.now()
    since = now - dt.timedelta(seconds=runtime.settings.connector_session_ttl)
    session = (ConnectorSession.select()
               .where((ConnectorSession.user == _user_id(user)) & ConnectorSession.ended_at.is_null()
                      & (ConnectorSession.last_seen_at >= since))
               .order_by(ConnectorSession.last_seen_at.desc()).first())
    if session is None:
        return ConnectorSession.create(user=_user_id(user), started_at=now, last_seen_at=now)
    ConnectorSession.update(last_seen_at=now).where(ConnectorSession.id == session.id).execute()
    session.last_seen_at = now
    return session


def end_session(runtime, user) -> int:
    """The user signed out of the EHR: end their open sessions. Returns how many ended."""
    return (ConnectorSession.update(ended_at=runtime.clock.now())
            .where((ConnectorSession.user == _user_id(user)) & ConnectorSession.ended_at.is_null())
            .execute())


def active_during(start: dt.datetime, end: dt.datetime, ttl: int):
    """Peewee condition: the session was active at some moment of [start, end]."""
    return ((ConnectorSession.started_at <= end)
            & (ConnectorSession.last_seen_at >= start - dt.timedelta(seconds=ttl))
            & (ConnectorSession.ended_at.is_null() | (ConnectorSession.ended_at >= start)))
