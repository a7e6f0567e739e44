"""Changing an application's manifest: name, launch URL, redirect base URL, token endpoint (or
none, the identity-provider variant), allowed URLs/origins and declared user-field permissions.

One function applies a change for every caller (the console and `svc-auth apps update`), after
the one manifest validation (`lifecycle.manifest_validation`, which registration uses too), writes one audit event naming the actor and what changed, and is the place where a
changed application is announced to every process (the authorize rule and userinfo read the
application row on each request).
"""
from __future__ import annotations

from app_cache.applications import TOPIC as APPLICATIONS
from lifecycle.manifest_validation import FIELDS, ManifestInvalid, validate  # noqa: F401  (ManifestInvalid: re-exported)
from lifecycle.applications import find_application
from models.application import Application
from models.audit import AuditEvent

# The spec's subsections of "User permissions (read)", in its order.
PERMISSION_GROUPS = (
    ("Identity", (("email", "Email address"),)),
    ("Name", (("name", "Given and family name"),)),
    ("EHR", (("ehrUsername", "EHR username"),)),
    ("Organization", (("organization", "Organization (clinic) id and name"),)),
)

def manifest_of(app: Application) -> dict:
    return {"name": app.name, "launch_url": app.launch_url, "redirect_uri": app.redirect_uri,
            "token_endpoint": app.token_endpoint, "allowed_origins": list(app.allowed_origins or []),
            "user_fields": list(app.user_fields or [])}


def update_manifest(runtime, application_id: str, actor: str, **changes) -> Application:
    """Apply `changes` (a subset of `FIELDS`) to the application; audited with `actor`.

    Returns the updated application. Unchanged values write nothing and record nothing.
    `runtime` is where the change is announced to every process (the application caches)."""
    app = find_application(application_id)
    clean = validate(changes)
    before = manifest_of(app)
    changed = {key: value for key, value in clean.items() if before[key] != value}
    if not changed:
        return app
    columns = dict(changed)
    if "redirect_uri" in changed and app.redirect_uri_match == "exact":
        # In exact mode the manifest URI is the first registered one: it is replaced, the others stay.
        columns["redirect_uris"] = [changed["redirect_uri"],
                                    *[u for u in app.redirect_uris if u not in (app.redirect_uri, changed["redirect_uri"])]]
    with runtime.db.atomic():
        Application.update(**columns).where(Application.id == app.id).execute()
        AuditEvent.record(actor, "application.manifest_updated", app.id,
                          before={k: before[k] for k in changed}, after=changed)
    runtime.changes.announce(APPLICATIONS)  # every process drops its cached copy now
    return Application.get_by_id(app.id)
