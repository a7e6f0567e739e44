"""Client-secret rotation (the spec's four steps), and which secret a client may present.

1. `generate_fallback_secret`: a new random secret, stored hashed as pending; not valid yet.
2. The partner deploys it as its backend's fallback: the backend presents its current secret and,
   on a 4xx, retries once with the fallback.
3. `activate_fallback_secret`: the fallback becomes the only valid secret; the old one stops.
   Its keyed hash is kept as the retired secret for SVC_RETIRED_SECRET_GRACE (30 days).
4. The partner makes the fallback its current secret.

`presented_secret` is the check every client authentication makes: only the current secret is
valid, never a pending fallback, so the backend's retry with the fallback succeeds exactly when
step 3 has happened. Between steps 3 and 4 every exchange starts with the retired secret: it is
recognised (`RETIRED`) and answered 401 "retired by rotation", and is not a failed guess (no
throttle, no `auth.lockout`). We cannot see step 4 (it happens in the partner's backend), so the
retired hash is recognised for the grace period from activation; the next activation replaces it.
(CLI: `apps secret`; console: the application page.)
"""
from __future__ import annotations

import datetime as dt
import hmac

from app_cache.applications import TOPIC as APPLICATIONS
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


CURRENT, RETIRED = "current", "retired"
_NO_HASH = "0" * 64  # compared against when there is no retired hash: the same work either way


def is_current_secret(app: Application, secret: str, hasher) -> bool:
    """True when `secret` is the application's current secret (constant-time HMAC compare, under
    SVC_HMAC_KEY or a previous key). A public client has none (its stored hash is empty), so nothing matches."""
    return not app.public and hasher.matches(secret, app.client_secret_hash)


def hashed_under_current_key(app: Application, hasher) -> bool:
    """True when the current SVC_HMAC_KEY is known to have made the application's secret hash
    (else the next successful authentication re-hashes it: `rehash_secret`)."""
    return app.secret_key_id == hasher.key_id


def rehash_secret(runtime, app: Application, secret: str) -> None:
    """Store `secret` (just authenticated) hashed under the current SVC_HMAC_KEY: what an earlier
    key hashed keeps working once that key is retired. Every process reloads the application."""
    (Application.update(client_secret_hash=runtime.hasher.digest(secret), secret_key_id=runtime.hasher.key_id)
     .where((Application.id == app.id) & (Application.client_secret_hash == app.client_secret_hash)).execute())
    runtime.changes.announce(APPLICATIONS)


def presented_secret(app: Application | None, secret: str, hasher, clock) -> str | None:
    """`CURRENT`, `RETIRED` (the secret the last rotation retired, before `clock.now()` passes the end of
    its grace period) or None.

    One HMAC of the secret per key (SVC_HMAC_KEY, then each of SVC_HMAC_KEY_PREVIOUS), each compared
    in constant time with the current hash and with the retired hash (or a stand-in): which wrong
    secret was sent does not change the work. For no application (an unknown client_id) the same
    HMACs are computed, so an unknown client costs what a known one does. A public client has no
    secret: nothing matches."""
    digests = hasher.digests(secret)  # SVC_HMAC_KEY's, then SVC_HMAC_KEY_PREVIOUS's
    known = app is not None and not app.public
    current = retired_match = False
    retired = app.retired_secret_hash if known else None
    live = bool(retired) and app.retired_secret_until is not None and clock.now() < app.retired_secret_until
    for digest in digests:
        current |= hmac.compare_digest(digest, app.client_secret_hash if known else _NO_HASH)
        retired_match |= hmac.compare_digest(digest, retired if live else _NO_HASH)
    if current and known:
        return CURRENT
    if retired_match and live:
        return RETIRED
    return None


def generate_fallback_secret(runtime, application_id: str, actor: str = "operator") -> str:
    """Rotation step 1: a new random secret, stored as pending; not valid until activated."""
    app = _application(application_id)
    _not_public(app)
    secret = new_secret()
    (Application.update(fallback_secret_hash=runtime.hasher.digest(secret), fallback_key_id=runtime.hasher.key_id)
     .where(Application.id == app.id).execute())
    AuditEvent.record(actor, "application.secret.fallback_generated", app.id)
    runtime.changes.announce(APPLICATIONS)
    return secret


def activate_fallback_secret(runtime, application_id: str, actor: str = "operator") -> None:
    """Rotation step 3: the pending fallback becomes the only valid secret; the old one stops working
    and is kept as the retired secret (its keyed hash) for SVC_RETIRED_SECRET_GRACE seconds."""
    app = _application(application_id)
    _not_public(app)
    if not app.fallback_secret_hash:
        raise ApiError(409, "no_fallback_secret", "Generate a fallback secret first (apps secret generate-fallback).")
    until = runtime.clock.now() + dt.timedelta(seconds=runtime.settings.retired_secret_grace)
    (Application.update(client_secret_hash=Application.fallback_secret_hash, fallback_secret_hash=None,
                        secret_key_id=Application.fallback_key_id, fallback_key_id=None,
                        retired_secret_hash=Application.client_secret_hash, retired_secret_until=until)
     .where(Application.id == app.id).execute())
    AuditEvent.record(actor, "application.secret.fallback_activated", app.id,
                      retired_secret_until=until.isoformat() + "Z")
    runtime.changes.announce(APPLICATIONS)
