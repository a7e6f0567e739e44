"""The two listings: organizations using an application, and the users of one of them.

A user's status is derived from what happened, never stored:
`authorized` — the platform verified a token of this app for them (they completed its auth flow);
`active` — they can use the hub (accepted an invitation, or were registered by the EHR directly);
`invited` — invited through the API and have not opened the invitation yet.
"""
from __future__ import annotations

import peewee

from models.application import Application, Authorization, Installation
from models.clock import utc_iso
from models.directory import Organization, User
from models.grants import Launch
from errors import ApiError
from partner_api.access import installation_of, own_application


def organizations_of(app: Application) -> list[dict]:
    user_count = (User.select(peewee.fn.COUNT(User.id)).where(User.organization == Organization.id))
    rows = (Installation.select(Installation, Organization, user_count.alias("user_count"))
            .join(Organization).where(Installation.application == app.id)
            .order_by(Installation.installed_at, Organization.id).objects())
    return [{"id": row.organization.id, "name": row.organization.name, "ehr": row.organization.ehr,
             "installed_at": utc_iso(row.installed_at), "activation_status": row.activation_status,
             "user_count": int(row.user_count or 0)} for row in rows]


def user_status(user: User, authorization: Authorization | None) -> str:
    if authorization is not None:
        return "authorized"
    if user.invited_at is not None and user.activated_at is None:
        return "invited"
    return "active"


def users_of(app: Application, organization_id: str) -> list[dict]:
    users = list(User.select().where(User.organization == organization_id).order_by(User.created_at, User.id))
    ids = [u.id for u in users]
    authorizations = {a.user_id: a for a in Authorization.select().where(
        (Authorization.application == app.id) & Authorization.user.in_(ids))} if ids else {}
    last_launch = {row.user_id: row.last for row in (
        Launch.select(Launch.user, peewee.fn.MAX(Launch.created_at).alias("last"))
        .where((Launch.application == app.id) & Launch.user.in_(ids)).group_by(Launch.user))} if ids else {}
    result = []
    for user in users:
        authorization = authorizations.get(user.id)
        last = last_launch.get(user.id)
        if isinstance(last, str):  # SQLite returns MAX() of a datetime column as text
            last = peewee.DateTimeField().python_value(last)
        result.append({
            "id": user.id, "email": user.email, "given_name": user.given_name, "family_name": user.family_name,
            "npi": user.npi, "status": user_status(user, authorization),
            "authorized_at": utc_iso(authorization.first_verified_at) if authorization else None,
            "last_launch_at": utc_iso(last),
        })
    return result


def own_organizations(app: Application, application_id: str) -> list[dict]:
    """`organizations_of` for the path's applicationId, which must be the caller's own."""
    return organizations_of(own_application(app, application_id))


def own_users(app: Application, application_id: str, organization_id: str) -> list[dict]:
    """`users_of` an organization where the caller's own application is installed."""
    own = own_application(app, application_id)
    installation_of(own, organization_id)
    return users_of(own, organization_id)


def update_activation(runtime, app: Application, application_id: str, organization_id: str, body: dict) -> dict:
    """`PUT .../activation-status`: the caller sets its own installation's status."""
    from lifecycle.activation import set_activation_status
    own = own_application(app, application_id)
    installation = installation_of(own, organization_id)
    unknown = sorted(set(body) - {"status"})
    if unknown:
        raise ApiError(400, "unknown_field", f"Unknown field(s): {', '.join(unknown)}.")
    installation = set_activation_status(runtime, installation, body.get("status"), actor=own.id)
    return {"status": installation.activation_status, "trial_started_at": utc_iso(installation.trial_started_at)}
