"""The platform verified an access token: the user completed the app's auth flow.

That fact drives the rest of the lifecycle: it records the authorization (the appointment sync
counts it), moves a new installation to `Disabled` (spec: first SDK initialization), and bills
the user for the month while the installation is `Enabled`. It is also activity of the user in the
hub, so it opens or renews their connector session (the nightly sync reads those).
"""
from __future__ import annotations

from workers.activity import record_activity
from lifecycle.billing import record_billable_use
from models.application import Authorization, Installation
from models.audit import AuditEvent
from oauth.introspection import introspection_response
from oauth.resource import active_user_token


def record_platform_verification(runtime, app, user) -> Installation | None:
    now = runtime.clock.now()
    (Authorization.insert(application=app.id, user=user.id, first_verified_at=now, last_verified_at=now)
     .on_conflict(conflict_target=[Authorization.application, Authorization.user],
                  update={Authorization.last_verified_at: now})
     .execute())
    first_initialization = (
        Installation.update(activation_status="Disabled")
        .where((Installation.application == app.id) & (Installation.organization == user.organization_id)
               & Installation.activation_status.is_null())
        .execute())
    if first_initialization:
        # The conditional UPDATE lets exactly one verification make this transition, so it is audited once.
        AuditEvent.record("platform", "installation.activation_status_set", f"{app.id}/{user.organization_id}",
                          before=None, after="Disabled", user_id=user.id)
    record_activity(runtime, user)
    installation = Installation.find(app.id, user.organization_id)
    record_billable_use(app, user, installation, now)
    return installation


def platform_introspection(runtime, authorization: str, token: str) -> dict:
    """`POST {p}/oauth/introspect` by the platform (`authorization`: Bearer, the sandbox token of the hub's user).

    An access token that is active and was issued to that same user is the platform verification
    (`record_platform_verification`). Only then does the answer carry `id_token`: the ID token the
    service issued with that access token, which the hub passes to the app's SDK (`getIdToken()` in
    the identity-provider variant, where the app handed the SDK only its access token)."""
    from lifecycle.sandbox import sandbox_user
    platform_user = sandbox_user(runtime, authorization)
    claims = active_user_token(runtime, token)
    if claims is None or claims["sub"] != platform_user.id:
        return introspection_response(None)
    app = runtime.applications.by_client_id(claims["client_id"])
    if app is None:
        return introspection_response(None)
    record_platform_verification(runtime, app, platform_user)
    body = introspection_response(claims)
    sealed = claims.get("svc_idt")
    body["id_token"] = runtime.hasher.unseal(sealed, claims["jti"]) if isinstance(sealed, str) else None
    return body
