"""The platform verified an access token: the user completed the app's auth flow.

That fact drives the rest of the lifecycle: it records the authorization (the appointment sync
counts it), moves a new installation to `Disabled` (spec: first SDK initialization; like every
`Disabled`, that ends the app's SMART refresh-token grants in the clinic), and bills
the user for the month while the installation is `Enabled`. It is also activity of the user in the
hub, so it opens or renews their connector session (the nightly sync reads those).
"""
from __future__ import annotations

from workers.activity import record_activity
from lifecycle.activation import end_installation_grants
from lifecycle.billing import record_billable_use
from models.application import DISABLED, Authorization, Installation
from models.audit import AuditEvent


def record_platform_verification(runtime, app, user) -> Installation | None:
    now = runtime.clock.now()
    (Authorization.insert(application=app.id, user=user.id, first_verified_at=now, last_verified_at=now)
     .on_conflict(conflict_target=[Authorization.application, Authorization.user],
                  update={Authorization.last_verified_at: now})
     .execute())
    with runtime.db.atomic():  # the grants cannot be ended (deny-list unreachable: 503): no transition
        first_initialization = (
            Installation.update(activation_status=DISABLED)
            .where((Installation.application == app.id) & (Installation.organization == user.organization_id)
                   & Installation.activation_status.is_null())
            .execute())
        if first_initialization:
            # Disabled like any other: grants made before it (no status yet, the app opened) end.
            end_installation_grants(runtime, app.id, user.organization_id)
            # The conditional UPDATE lets exactly one verification make this transition, so it is audited once.
            AuditEvent.record("platform", "installation.activation_status_set", f"{app.id}/{user.organization_id}",
                              before=None, after=DISABLED, user_id=user.id)
    record_activity(runtime, user)
    installation = Installation.find(app.id, user.organization_id)
    record_billable_use(app, user, installation, now)
    return installation
