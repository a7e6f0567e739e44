"""Client-secret rotation (the spec's four steps), and which secret a client may present.

1. `generate_fallback_secret`: a new random secret, stored hashed as pending; not valid yet.
2. The partner deploys it as its backend's fallback: the backend presents its current secret and,
   on a 4xx, retries once with the fallback.
3. `activate_fallback_secret`: the fallback becomes the only valid secret; the old one stops.
4. The partner makes the fallback its current secret.

`is_current_secret` is the check every client authentication makes: only the current secret is
valid, never a pending fallback, so the backend's retry with the fallback succeeds exactly when
step 3 has happened. (CLI: `apps secret`; console: the application page.)
"""
from __future__ import annotations

from hotcache.applications import TOPIC as APPLICATIONS
from models.application import Application
from models.audit import AuditEvent
from models.ids import new_secret
from errors import ApiError


def _application(application_id: str) -> Application:
    app = Application.get_or_none(Application.id == application_id)
    if app is None:
        raise ApiError(404, "application_not_found", f"No application has id {application_id!r}.")
    return app


def _not_public(app: Application) -> None:
    if app.public:
        raise ApiError(409, "public_client", "A public client has no secret to rotate.")


def is_current_secret(app: Application, secret: str, hasher) -> bool:
    """True when `secret` is the application's current secret (constant-time HMAC compare). A
    public client has none (its stored hash is empty), so nothing matches."""
    return not app.public and hasher.matches(secret, app.client_secret_hash)


def generate_fallback_secret(runtime, application_id: str, actor: str = "operator") -> str:
    """Rotation step 1: a new random secret, stored as pending; not valid until activated."""
    app = _application(application_id)
    _not_public(app)
    secret = new_secret()
    Application.update(fallback_secret_hash=runtime.hasher.digest(secret)).where(Application.id == app.id).execute()
    AuditEvent.record(actor, "application.secret.fallback_generated", app.id)
    runtime.changes.announce(APPLICATIONS)
    return secret


def activate_fallback_secret(runtime, application_id: str, actor: str = "operator") -> None:
    """Rotation step 3: the pending fallback becomes the only valid secret; the old one stops working."""
    app = _application(application_id)
    _not_public(app)
    if not app.fallback_secret_hash:
        raise ApiError(409, "no_fallback_secret", "Generate a fallback secret first (apps secret generate-fallback).")
    (Application.update(client_secret_hash=Application.fallback_secret_hash, fallback_secret_hash=None)
     .where(Application.id == app.id).execute())
    AuditEvent.record(actor, "application.secret.fallback_activated", app.id)
    runtime.changes.announce(APPLICATIONS)
