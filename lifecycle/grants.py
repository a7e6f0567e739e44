"""Operators and partners end SMART refresh-token grants (`svc-auth grants revoke`, the console's
Revoke button): audited, through `oauth.smart_grants.revoke_grants`."""
from __future__ import annotations

from models.audit import AuditEvent
from models.ids import is_id
from models.refresh import SmartGrant
from errors import ApiError
from oauth.smart_grants import revoke_grants


def end_grants(runtime, actor: str, grant_id: str | None = None, application_id: str | None = None,
               user_id: str | None = None, organization_id: str | None = None) -> int:
    """Revoke the live grants matching every filter given (at least one); returns how many."""
    filters = ((SmartGrant.id, grant_id), (SmartGrant.application, application_id), (SmartGrant.user, user_id),
               (SmartGrant.organization, organization_id))
    given = [(field, value) for field, value in filters if value is not None]
    if not given:
        raise ApiError(400, "invalid_request", "Name the grants to revoke: a grant, an application or a user.")
    if not all(is_id(value) for _, value in given):
        return 0  # no stored id has that shape (NUL, overlong: PostgreSQL refused them with a 500)
    condition = given[0][0] == given[0][1]
    for field, value in given[1:]:
        condition &= field == value
    count = revoke_grants(runtime, condition, "revoked_by_operator" if actor == "operator" else "revoked_by_developer")
    AuditEvent.record(actor, "grants.revoked", grant_id or application_id or user_id or organization_id,
                      grant_id=grant_id, application_id=application_id, user_id=user_id,
                      organization_id=organization_id, revoked=count)
    return count
