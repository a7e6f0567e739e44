"""Applications and their installations: register, install, delete, and the redirect, PKCE,
client type (public or confidential), declared SMART scopes and REST-network settings.

Every change to an application ends with `runtime.changes.announce(APPLICATIONS)`: each process
keeps applications in memory (app_cache) and drops them when it hears of a change.
"""
from __future__ import annotations

import re

from app_cache.applications import TOPIC as APPLICATIONS
from bulk.build import delete_export
from fhir_api.limits import rate_text
from lifecycle.manifest_validation import validate
from lifecycle.organizations import find_organization, invalid
from models.application import BILLING_PLANS, DISABLED, Application, Installation
from models.audit import AuditEvent
from models.bulk import BulkExport
from models.charts import ChartRequest
from models.grants import AuthorizationCode
from models.ids import new_secret
from models.refresh import SmartGrant
from errors import ApiError
from oauth.redirects import MATCH_MODES, RedirectUriError, normalise_redirect_uri
from oauth.scopes import InvalidScope, validate_declared
from oauth.smart_grants import revoke_grants


def find_application(application_id: str) -> Application:
    """The application with this id, else 404 `application_not_found`."""
    app = Application.get_or_none(Application.id == application_id)
    if app is None:
        raise ApiError(404, "application_not_found", f"No application has id {application_id!r}.")
    return app


def save_changes(app: Application) -> None:
    """Write the columns changed on `app`, only those: a full-row save from a copy read before
    another change committed (a secret activated meanwhile) would write that change back."""
    if app.dirty_fields:
        app.save(only=app.dirty_fields)


def record_change(runtime, app: Application, actor: str, action: str, **detail) -> Application:
    """Save a changed application, audit it (`action` with `detail`) and tell every process."""
    save_changes(app)
    AuditEvent.record(actor, action, app.id, **detail)
    runtime.changes.announce(APPLICATIONS)
    return app


def _redirect_policy(redirect_uri: str, mode: str, redirect_uris) -> list[str]:
    """Validate a redirect registration; returns the list of exact URIs (empty in prefix mode)."""
    if mode not in MATCH_MODES:
        raise invalid(f"redirect_uri_match must be one of {', '.join(MATCH_MODES)}, got {mode!r}.")
    uris = [redirect_uri, *[u for u in redirect_uris if u != redirect_uri]]
    for uri in uris:
        try:
            normalise_redirect_uri(uri)
        except RedirectUriError as exc:
            raise invalid(f"{uri!r} cannot be a redirect URI: {exc}.") from None
    if mode == "prefix" and len(uris) > 1:
        raise invalid("Several redirect URIs need redirect_uri_match=exact; prefix mode has one base URL.")
    return uris if mode == "exact" else []


def set_redirect_policy(runtime, application_id: str, mode: str, redirect_uris=(), actor: str = "operator") -> Application:
    """Switch an app between prefix and exact redirect_uri matching (CLI and console use this)."""
    app = find_application(application_id)
    app.redirect_uris = _redirect_policy(app.redirect_uri, mode, redirect_uris)
    app.redirect_uri_match = mode
    return record_change(runtime, app, actor, "application.redirect_policy_set", mode=mode,
                         redirect_uris=app.redirect_uris)


def set_require_pkce(runtime, application_id: str, required: bool, actor: str = "operator") -> Application:
    """Make PKCE (S256) mandatory, or optional again, for one app's authorization requests."""
    app = find_application(application_id)
    app.require_pkce = bool(required)
    return record_change(runtime, app, actor, "application.require_pkce_set", required=app.require_pkce)


def declared_smart_scopes(scope: str) -> str:
    """The SMART scopes an application declares (`--smart-scopes`), normalised; 400 for an unknown one."""
    if not isinstance(scope, str) or len(scope) > 2000 or "\x00" in scope:
        raise invalid("smart_scopes must be a space-separated list of scopes.")
    try:
        return validate_declared(scope)
    except InvalidScope as exc:
        raise invalid(f"smart_scopes: {exc.message}") from None


def set_smart_scopes(runtime, application_id: str, scope: str, actor: str = "operator") -> Application:
    """The SMART scopes the app declares: authorize grants at most these (oauth.scopes.granted_scope)."""
    app = find_application(application_id)
    app.smart_scopes = declared_smart_scopes(scope)
    return record_change(runtime, app, actor, "application.smart_scopes_set", smart_scopes=app.smart_scopes)


def set_fhir_rate_limits(runtime, application_id: str, actor: str = "operator", **limits) -> Application:
    """The app's own FHIR API limits (`fhir_rate_limit` per clinic, `fhir_token_rate_limit` per
    token): a `ratelimit.Limit`, or None for the configured default. Every process applies them at
    once (the application caches are dropped)."""
    app = find_application(application_id)
    unknown = set(limits) - {"fhir_rate_limit", "fhir_token_rate_limit"}
    if unknown:
        raise ValueError(f"not a FHIR limit: {', '.join(sorted(unknown))}")
    for name, limit in limits.items():
        setattr(app, name, rate_text(limit) if limit is not None else None)
    return record_change(runtime, app, actor, "application.fhir_rate_limits_set",
                         **{name: getattr(app, name) for name in limits})


_WHOLE_SECONDS = re.compile(r"[0-9]{1,12}")  # ASCII digits, matched whole (`str.isdigit` takes "²", `int` refuses it)


def whole_seconds(text: str) -> int | None:
    """`text` (spaces around ignored) as a whole number of seconds, or None when it is not one:
    how the console and `apps update --offline-access-ttl` read an `offline_access` lifetime."""
    text = text.strip()
    return int(text) if _WHOLE_SECONDS.fullmatch(text) else None


def set_offline_access_ttl(runtime, application_id: str, seconds: int | None, actor: str = "operator") -> Application:
    """How long this app's `offline_access` grants live (seconds, 1 hour to 5 years), or None for
    SVC_OFFLINE_ACCESS_TTL. Applies to grants started from now on."""
    if seconds is not None and (not isinstance(seconds, int) or isinstance(seconds, bool)
                                or not 3600 <= seconds <= 5 * 366 * 24 * 3600):
        raise invalid("offline_access_ttl must be a whole number of seconds from 3600 (an hour) to 5 years.")
    app = find_application(application_id)
    app.offline_access_ttl = seconds
    return record_change(runtime, app, actor, "application.offline_access_ttl_set", seconds=seconds)


def set_public(runtime, application_id: str, public: bool, actor: str = "operator") -> tuple[Application, str | None]:
    """Make the app a public client (no secret: every secret it had stops working at once, PKCE S256
    required) or a confidential one again (a new secret, returned to be shown once).

    A confidential app made public loses its SMART refresh-token grants and its unused codes issued
    without PKCE: both were bound to a client that authenticates with its secret, which the app can
    no longer present; left live they would be redeemed by anyone naming the public client_id alone
    (a thief of a token or a code included)."""
    app = find_application(application_id)
    secret = None
    made_public = bool(public) and not app.public
    if public:
        app.client_secret_hash, app.fallback_secret_hash = "", None
        app.retired_secret_hash, app.retired_secret_until = None, None
    elif app.public:
        secret = new_secret()
        app.client_secret_hash, app.secret_key_id = runtime.hasher.digest(secret), runtime.hasher.key_id
    app.public = bool(public)
    with runtime.db.atomic():  # the deny-list unreachable (503): the app stays as it was
        save_changes(app)
        if made_public:
            revoke_grants(runtime, SmartGrant.application == app.id, "client_made_public")
            # Its unused codes without PKCE were bound by the secret alone: void them.
            AuthorizationCode.delete().where((AuthorizationCode.application == app.id)
                                             & AuthorizationCode.used_at.is_null()
                                             & AuthorizationCode.code_challenge.is_null()).execute()
    AuditEvent.record(actor, "application.client_type_set", app.id, public=app.public)
    runtime.changes.announce(APPLICATIONS)
    return app, secret


def register_application(runtime, name: str, redirect_uri: str, launch_url: str, token_endpoint: str | None = None,
                         billing_plan: str = "paid", user_fields=("email",), allowed_origins=(),
                         application_id: str | None = None, client_id: str | None = None,
                         client_secret: str | None = None, redirect_uri_match: str = "prefix",
                         redirect_uris=(), require_pkce: bool = False, public: bool = False,
                         smart_scopes: str | None = None) -> tuple[Application, str | None]:
    """Register an app; returns it and its client secret (shown once, stored only hashed), or None
    for a public client (token_endpoint_auth_method `none`: no secret at all).

    The manifest fields pass the one manifest validation (`lifecycle.manifest_validation`)."""
    manifest = validate({"name": name, "launch_url": launch_url, "redirect_uri": redirect_uri,
                         "token_endpoint": token_endpoint, "allowed_origins": list(allowed_origins or ()),
                         "user_fields": list(user_fields or ())})
    exact_uris = _redirect_policy(manifest["redirect_uri"], redirect_uri_match, redirect_uris)
    if billing_plan not in BILLING_PLANS:
        raise invalid(f"billing plan must be one of {', '.join(BILLING_PLANS)}.")
    if public and client_secret:
        raise invalid("A public client has no client secret.")
    secret = None if public else client_secret or new_secret()
    fields = dict(**manifest, billing_plan=billing_plan, client_secret_hash=runtime.hasher.digest(secret) if secret else "",
                  secret_key_id=runtime.hasher.key_id if secret else None,
                  redirect_uri_match=redirect_uri_match, redirect_uris=exact_uris, require_pkce=bool(require_pkce),
                  public=bool(public))
    if smart_scopes is not None:
        fields["smart_scopes"] = declared_smart_scopes(smart_scopes)
    if application_id:
        fields["id"] = application_id
    if client_id:
        fields["client_id"] = client_id
    app = Application.create(**fields)
    AuditEvent.record("operator", "application.created", app.id, client_id=app.client_id)
    runtime.changes.announce(APPLICATIONS)
    return app, secret


def install_application(application_id: str, organization_id: str) -> Installation:
    """Install the app in the clinic (idempotent). A backend app (registered keys: SMART Backend
    Services) has no SDK to initialize: its installation starts `Disabled`, and the partner
    Enables it (`PUT .../activation-status`)."""
    app = find_application(application_id)
    find_organization(organization_id)
    existing = Installation.find(application_id, organization_id)
    if existing:
        return existing
    return Installation.create(application=application_id, organization=organization_id,
                               activation_status=DISABLED if app.is_backend else None)


def set_rest_allowed_networks(runtime, application_id: str, networks, actor: str = "operator") -> list[str]:
    """The networks (CIDRs) allowed to call the REST API as this application; empty: any network
    SVC_REST_ALLOWED_NETWORKS allows."""
    import ipaddress
    find_application(application_id)
    try:
        cidrs = [str(ipaddress.ip_network(n, strict=False)) for n in networks]
    except ValueError as exc:
        raise invalid(f"not a network: {exc}") from None
    Application.update(rest_allowed_networks=cidrs).where(Application.id == application_id).execute()
    AuditEvent.record(actor, "application.rest_allowed_networks_set", application_id, networks=cidrs)
    runtime.changes.announce(APPLICATIONS)
    return cidrs


def delete_application(runtime, application_id: str, actor: str = "operator") -> Application:
    """Remove an application with its installations, launches, codes and tokens (the foreign keys
    cascade); its client credentials stop working at once. Its billing ledger stays (no foreign
    key: `billing report` still lists its rows). Audited. Its charts' ZIPs and Bulk Data
    files go first: only its rows lead the expiry sweeps to them, and the cascade deletes those."""
    app = find_application(application_id)
    _delete_stored_files(runtime, app.id)
    with Application._meta.database.atomic():
        # recursive: peewee deletes the dependent rows itself, so SQLite without foreign-key
        # enforcement and tables other parts add later behave the same.
        app.delete_instance(recursive=True)
        AuditEvent.record(actor, "application.deleted", app.id, client_id=app.client_id, name=app.name)
    runtime.changes.announce(APPLICATIONS)  # every process forgets it: its credentials stop working
    return app


def _delete_stored_files(runtime, application_id: str) -> None:
    """The objects the app's chart requests and exports stored, each before its row (a stop between
    the two leaves a row whose object is gone, never an object nothing finds)."""
    for request in ChartRequest.select(ChartRequest.id, ChartRequest.object_key).where(
            (ChartRequest.application == application_id) & ChartRequest.object_key.is_null(False)):
        runtime.batch_object_store.delete(request.object_key)
        ChartRequest.update(object_key=None).where(ChartRequest.id == request.id).execute()
    for (export_id,) in BulkExport.select(BulkExport.id).where(BulkExport.application == application_id).tuples():
        delete_export(runtime, export_id)
