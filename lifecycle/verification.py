"""The platform verified an access token: the user completed the app's auth flow.

That fact drives the rest of the lifecycle: it records the authorization (appointment sync and
billing count it), moves a new installation to `Disabled` (spec: first SDK initialization), and
hooks registered by other parts (billing) run after it.
"""
from __future__ import annotations

from models.application import Authorization, Installation
from models.clock import clock

on_verified_hooks: list = []
"""Callables `(app, user, installation)` run after each platform verification."""


def record_platform_verification(app, user) -> Installation | None:
    now = clock.now()
    (Authorization.insert(application=app.id, user=user.id, first_verified_at=now, last_verified_at=now)
     .on_conflict(conflict_target=[Authorization.application, Authorization.user],
                  update={Authorization.last_verified_at: now})
     .execute())
    (Installation.update(activation_status="Disabled")
     .where((Installation.application == app.id) & (Installation.organization == user.organization_id)
            & Installation.activation_status.is_null())
     .execute())
    installation = Installation.find(app.id, user.organization_id)
    for hook in on_verified_hooks:
        hook(app, user, installation)
    return installation
