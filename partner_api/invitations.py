"""`POST /v1/invitations`: a new account (user) and organization, the app installed there, and a
single-use, expiring link that lets the invited user into the sandbox hub."""
from __future__ import annotations

import datetime as dt

from lifecycle.applications import install_application
from lifecycle.organizations import create_organization
from lifecycle.users import create_user
from models.application import Application
from models.audit import AuditEvent
from models.clock import utc_iso
from models.directory import User
from models.ids import new_secret
from models.invitations import Invitation
from errors import ApiError

INVITATION_FIELDS = frozenset({"email", "given_name", "family_name", "organization_name", "npi"})
REQUIRED = ("email", "given_name", "family_name", "organization_name")


def invitation_fields(body: dict) -> dict:
    """The validated request body; unknown fields are refused so typos do not pass silently."""
    unknown = sorted(set(body) - INVITATION_FIELDS)
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
    email = fields["email"].lower()
    token = new_secret()
    now = runtime.clock.now()
    with runtime.db.atomic():
        # Checked first (and again by the unique index inside create_user) so a repeated
        # invitation creates no orphan organization.
        if User.get_or_none(User.email == email) is not None:
            raise ApiError(409, "email_taken", f"A user with e-mail {email} already exists; nothing was created.")
        org = create_organization(fields["organization_name"])
        user = create_user(org.id, email, fields["given_name"], fields["family_name"], npi=fields.get("npi"))
        User.update(invited_at=now).where(User.id == user.id).execute()
        install_application(app.id, org.id)
        invitation = Invitation.create(token_hash=runtime.hasher.digest(token), key_id=runtime.hasher.key_id, application=app.id,
                                       organization=org.id, user=user.id, created_at=now,
                                       expires_at=now + dt.timedelta(seconds=runtime.settings.invitation_ttl))
        AuditEvent.record(app.id, "invitation.created", user.id, organization_id=org.id)
    return {"invitation_url": f"{runtime.settings.public_url}/invitations/{token}",
            "expires_at": utc_iso(invitation.expires_at), "organization_id": org.id, "user_id": user.id}


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
