"""`POST /v1/invitations`: a new account (user) and organization, the app installed there, and a
single-use, expiring link that lets the invited user into the sandbox hub.

An e-mail names one user, so inviting one that has an account is 409 `email_taken`, with one
exception: the app's own invitee whose every link expired unopened (the link then says "ask for a
new invitation") is invited again, the same user and organization with the new request's details.
"""
from __future__ import annotations

import datetime as dt

from lifecycle.applications import install_application
from lifecycle.organizations import create_organization, update_organization
from lifecycle.users import clean_email, create_user, update_user
from models.application import Application, Authorization, Installation
from models.audit import AuditEvent
from models.clock import utc_iso
from models.directory import User
from models.ids import new_secret
from models.invitations import Invitation
from errors import ApiError

INVITATION_FIELDS = ("email", "given_name", "family_name", "organization_name", "npi")
"""In the documented order: a body with several bad fields is told about the first, the same in every process."""
REQUIRED = ("email", "given_name", "family_name", "organization_name")


def invitation_fields(body: dict) -> dict:
    """The validated request body; unknown fields are refused so typos do not pass silently."""
    unknown = sorted(set(body).difference(INVITATION_FIELDS))
    if unknown:
        raise ApiError(400, "unknown_field", f"Unknown field(s): {', '.join(unknown)}.")
    fields = {}
    for name in INVITATION_FIELDS:
        value = body.get(name)
        if value is None and name not in REQUIRED:
            continue
        if not isinstance(value, str) or not value.strip():
            rule = "is required and must be" if name in REQUIRED else "is optional; when given it must be"
            raise ApiError(400, "invalid_request", f"{name} {rule} a non-empty string.")
        if len(value) > 200:
            raise ApiError(400, "invalid_request", f"{name} must be at most 200 characters.")
        fields[name] = value.strip()
    return fields


def invite(runtime, app: Application, body: dict) -> dict:
    fields = invitation_fields(body)
    email = clean_email(fields["email"])
    token = new_secret()
    now = runtime.clock.now()
    with runtime.db.atomic():
        # Checked first (and again by the unique index inside create_user) so a repeated
        # invitation creates no orphan organization.
        existing = User.get_or_none(User.email == email)
        if existing is not None:
            user_id, organization_id = invite_again(app, existing, fields, now)
        else:
            org = create_organization(fields["organization_name"])
            user = create_user(org.id, email, fields["given_name"], fields["family_name"], npi=fields.get("npi"))
            User.update(invited_at=now).where(User.id == user.id).execute()
            install_application(app.id, org.id)
            user_id, organization_id = user.id, org.id
        invitation = Invitation.create(token_hash=runtime.hasher.digest(token), key_id=runtime.hasher.key_id, application=app.id,
                                       organization=organization_id, user=user_id, created_at=now,
                                       expires_at=now + dt.timedelta(seconds=runtime.settings.invitation_ttl))
        AuditEvent.record(app.id, "invitation.created", user_id, organization_id=organization_id)
    return {"invitation_url": f"{runtime.settings.public_url}/invitations/{token}",
            "expires_at": utc_iso(invitation.expires_at), "organization_id": organization_id, "user_id": user_id}


def expired_unopened(app: Application, user: User, now) -> bool:
    """Is `user` the app's invitee whose every invitation link expired unopened: never activated,
    no app authorized, the app still installed in their clinic, and no link live or used, the
    latest one this app's? The links go 30 days after they expired (`workers.retention`): with none
    left, the app installed in the clinic their invitation made is the one that invited them, when
    it is the only app installed there (another one installed since could be it: nobody is)."""
    if user.invited_at is None or user.activated_at is not None:
        return False
    if (Installation.find(app.id, user.organization_id) is None
            or Authorization.select().where(Authorization.user == user.id).exists()):
        return False
    links = Invitation.select().where(Invitation.user == user.id)
    latest = links.order_by(Invitation.created_at.desc()).first()
    if latest is None:  # the links are gone: the inviter is the clinic's one app, or nobody can tell
        return not Installation.select().where((Installation.organization == user.organization_id)
                                               & (Installation.application != app.id)).exists()
    return (latest.application_id == app.id and latest.organization_id == user.organization_id
            and not links.where(Invitation.used_at.is_null(False) | (Invitation.expires_at > now)).exists())


def invite_again(app: Application, user: User, fields: dict, now) -> tuple[str, str]:
    """(user id, organization id) of an invitee `expired_unopened` invited again, with this request's
    names, NPI and organization name; anyone else's e-mail is taken (409). Inside the caller's
    transaction: of two racing invitations of one e-mail, one moves `invited_at` and the other is 409."""
    if not expired_unopened(app, user, now) or not User.update(invited_at=now).where(
            (User.id == user.id) & (User.invited_at == user.invited_at) & User.activated_at.is_null()).execute():
        raise ApiError(409, "email_taken", f"A user with e-mail {user.email} already exists; nothing was created.")
    update_user(user.id, given_name=fields["given_name"], family_name=fields["family_name"],
                npi=fields.get("npi", ""), actor=app.id)  # "" clears an NPI the first invitation gave
    update_organization(user.organization_id, name=fields["organization_name"], actor=app.id)
    return user.id, user.organization_id


def accept(runtime, token: str) -> User:
    """Open an invitation once: the user becomes active. Unknown 404, used or expired 410."""
    invitation = Invitation.get_or_none(Invitation.token_hash.in_(runtime.hasher.digests(token or "")))
    if invitation is None:
        raise ApiError(404, "invitation_not_found", "This invitation link is not valid.")
    now = runtime.clock.now()
    with runtime.db.atomic():
        if not invitation.consume(now):
            if invitation.used_at is not None or Invitation.get_by_id(invitation.token_hash).used_at is not None:
                raise ApiError(410, "invitation_used", "This invitation link was already used; it works once.")
            raise ApiError(410, "invitation_expired", "This invitation link has expired; ask for a new invitation.")
        (User.update(activated_at=now)
         .where((User.id == invitation.user_id) & User.activated_at.is_null()).execute())
        AuditEvent.record(invitation.user_id, "invitation.accepted", invitation.user_id,
                          application_id=invitation.application_id)
    return User.get_by_id(invitation.user_id)
