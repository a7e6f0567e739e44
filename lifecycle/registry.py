"""Registering clinics, users, applications and installations (CLI and invitations use these).

Every change to an application ends with `runtime.changes.announce(APPLICATIONS)`: each process
keeps applications in memory (hotcache) and drops them when it hears of a change.
"""
from __future__ import annotations

import re

import peewee

from hotcache.applications import TOPIC as APPLICATIONS
from models.application import BILLING_PLANS, Application, Installation
from models.audit import AuditEvent
from models.directory import Organization, User
from models.ids import new_secret
from lifecycle.manifest_validation import validate
from oauth.errors import ApiError
from oauth.redirects import MATCH_MODES, RedirectUriError, normalise_redirect_uri, redirect_uri_allowed

EMAIL = re.compile(r"^[^@\s]{1,64}@[^@\s]+\.[^@\s]+$")
NPI = re.compile(r"^\d{10}$")


def invalid(message: str, error: str = "invalid_request") -> ApiError:
    return ApiError(400, error, message)


def find_application(application_id: str) -> Application:
    """The application with this id, else 404 `application_not_found`."""
    app = Application.get_or_none(Application.id == application_id)
    if app is None:
        raise ApiError(404, "application_not_found", f"No application has id {application_id!r}.")
    return app


def clean_email(email: str | None) -> str:
    """The address trimmed and lower-cased; 400 when it is not a plausible e-mail address."""
    email = (email or "").strip().lower()
    if not EMAIL.match(email) or len(email) > 254:
        raise invalid(f"{email!r} is not a valid e-mail address.")
    return email


def _http_url(name: str, value: str) -> str:
    if not redirect_uri_allowed(value, value):
        raise invalid(f"{name} must be an absolute http(s) URL without a fragment, got {value!r}.")
    return value


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
    app.save()
    AuditEvent.record(actor, "application.redirect_policy_set", app.id, mode=mode, redirect_uris=app.redirect_uris)
    runtime.changes.announce(APPLICATIONS)
    return app


def set_require_pkce(runtime, application_id: str, required: bool, actor: str = "operator") -> Application:
    """Make PKCE (S256) mandatory, or optional again, for one app's authorization requests."""
    app = find_application(application_id)
    app.require_pkce = bool(required)
    app.save()
    AuditEvent.record(actor, "application.require_pkce_set", app.id, required=app.require_pkce)
    runtime.changes.announce(APPLICATIONS)
    return app


def create_organization(name: str, ehr: str = "sandbox", ehr_url: str = "", org_id: str | None = None) -> Organization:
    name = (name or "").strip()
    if not name or len(name) > 200:
        raise invalid("An organization needs a name of 1 to 200 characters.")
    if not re.match(r"^[a-z0-9_-]{1,64}$", ehr or ""):
        raise invalid("ehr must be a short lower-case EHR name such as 'sandbox'.")
    fields = {"name": name, "ehr": ehr, "ehr_url": ehr_url or ""}
    if org_id:
        fields["id"] = org_id
    return Organization.create(**fields)


def create_user(organization_id: str, email: str, given_name: str | None = None, family_name: str | None = None,
                ehr_username: str | None = None, npi: str | None = None, user_id: str | None = None) -> User:
    org = Organization.get_or_none(Organization.id == organization_id)
    if org is None:
        raise ApiError(404, "organization_not_found", f"No organization has id {organization_id!r}.")
    email = clean_email(email)
    if npi is not None and not NPI.match(npi):
        raise invalid("npi must be 10 digits.")
    fields = dict(organization=org.id, email=email, given_name=given_name or None, family_name=family_name or None,
                  ehr_username=ehr_username or None, npi=npi or None)
    if user_id:
        fields["id"] = user_id
    try:
        return User.create(**fields)
    except peewee.IntegrityError:
        raise ApiError(409, "email_taken", f"A user with e-mail {email} already exists.") from None


def register_application(runtime, name: str, redirect_uri: str, launch_url: str, token_endpoint: str | None = None,
                         billing_plan: str = "paid", user_fields=("email",), allowed_origins=(),
                         application_id: str | None = None, client_id: str | None = None,
                         client_secret: str | None = None, redirect_uri_match: str = "prefix",
                         redirect_uris=(), require_pkce: bool = False) -> tuple[Application, str]:
    """Register an app; returns it and its client secret (shown once, stored only hashed).

    The manifest fields pass the one manifest validation (`lifecycle.manifest_validation`)."""
    manifest = validate({"name": name, "launch_url": launch_url, "redirect_uri": redirect_uri,
                         "token_endpoint": token_endpoint, "allowed_origins": list(allowed_origins or ()),
                         "user_fields": list(user_fields or ())})
    exact_uris = _redirect_policy(manifest["redirect_uri"], redirect_uri_match, redirect_uris)
    if billing_plan not in BILLING_PLANS:
        raise invalid(f"billing plan must be one of {', '.join(BILLING_PLANS)}.")
    secret = client_secret or new_secret()
    fields = dict(**manifest, billing_plan=billing_plan, client_secret_hash=runtime.hasher.digest(secret), redirect_uri_match=redirect_uri_match,
                  redirect_uris=exact_uris, require_pkce=bool(require_pkce))
    if application_id:
        fields["id"] = application_id
    if client_id:
        fields["client_id"] = client_id
    app = Application.create(**fields)
    AuditEvent.record("operator", "application.created", app.id, client_id=app.client_id)
    runtime.changes.announce(APPLICATIONS)
    return app, secret


def install_application(application_id: str, organization_id: str) -> Installation:
    find_application(application_id)
    if Organization.get_or_none(Organization.id == organization_id) is None:
        raise ApiError(404, "organization_not_found", f"No organization has id {organization_id!r}.")
    existing = Installation.find(application_id, organization_id)
    if existing:
        return existing
    return Installation.create(application=application_id, organization=organization_id)


def generate_fallback_secret(runtime, application_id: str, actor: str = "operator") -> str:
    """Rotation step 1: a new random secret, stored as pending; not valid until activated."""
    app = find_application(application_id)
    secret = new_secret()
    Application.update(fallback_secret_hash=runtime.hasher.digest(secret)).where(Application.id == app.id).execute()
    AuditEvent.record(actor, "application.secret.fallback_generated", app.id)
    runtime.changes.announce(APPLICATIONS)
    return secret


def activate_fallback_secret(runtime, application_id: str, actor: str = "operator") -> None:
    """Rotation step 3: the pending fallback becomes the only valid secret; the old one stops working."""
    app = find_application(application_id)
    if not app.fallback_secret_hash:
        raise ApiError(409, "no_fallback_secret", "Generate a fallback secret first (apps secret generate-fallback).")
    (Application.update(client_secret_hash=Application.fallback_secret_hash, fallback_secret_hash=None)
     .where(Application.id == app.id).execute())
    AuditEvent.record(actor, "application.secret.fallback_activated", app.id)
    runtime.changes.announce(APPLICATIONS)


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



def update_organization(organization_id: str, name: str | None = None, ehr: str | None = None,
                        ehr_url: str | None = None, actor: str = "operator") -> Organization:
    """Change an organization's name, EHR or EHR URL (None: unchanged); audited."""
    org = Organization.get_or_none(Organization.id == organization_id)
    if org is None:
        raise ApiError(404, "organization_not_found", f"No organization has id {organization_id!r}.")
    changes = {}
    if name is not None:
        name = name.strip()
        if not name or len(name) > 200:
            raise invalid("An organization needs a name of 1 to 200 characters.")
        changes["name"] = name
    if ehr is not None:
        if not re.match(r"^[a-z0-9_-]{1,64}$", ehr):
            raise invalid("ehr must be a short lower-case EHR name such as 'sandbox'.")
        changes["ehr"] = ehr
    if ehr_url is not None:
        if ehr_url:
            _http_url("ehr_url", ehr_url)
        changes["ehr_url"] = ehr_url
    if changes:
        Organization.update(**changes).where(Organization.id == org.id).execute()
        AuditEvent.record(actor, "organization.updated", org.id, **changes)
    return Organization.get_by_id(org.id)


def update_user(user_id: str, email: str | None = None, given_name: str | None = None,
                family_name: str | None = None, ehr_username: str | None = None, npi: str | None = None,
                actor: str = "operator") -> User:
    """Change a user's fields (None: unchanged; "" clears an optional field); audited."""
    user = User.get_or_none(User.id == user_id)
    if user is None:
        raise ApiError(404, "user_not_found", f"No user has id {user_id!r}.")
    changes: dict = {}
    if email is not None:
        changes["email"] = email = clean_email(email)
    for field, value in (("given_name", given_name), ("family_name", family_name), ("ehr_username", ehr_username)):
        if value is not None:
            changes[field] = value.strip() or None
    if npi is not None:
        if npi and not NPI.match(npi):
            raise invalid("npi must be 10 digits.")
        changes["npi"] = npi or None
    if changes:
        try:
            with User._meta.database.atomic():
                User.update(**changes).where(User.id == user.id).execute()
        except peewee.IntegrityError:
            raise ApiError(409, "email_taken", f"A user with e-mail {email} already exists.") from None
        AuditEvent.record(actor, "user.updated", user.id, fields=sorted(changes))
    return User.get_by_id(user.id)


def delete_application(runtime, application_id: str, actor: str = "operator") -> Application:
    """Remove an application with its installations, launches, codes and tokens (the foreign keys
    cascade); its client credentials stop working at once. Audited."""
    app = find_application(application_id)
    with Application._meta.database.atomic():
        # recursive: peewee deletes the dependent rows itself, so SQLite without foreign-key
        # enforcement and tables other parts add later behave the same.
        app.delete_instance(recursive=True)
        AuditEvent.record(actor, "application.deleted", app.id, client_id=app.client_id, name=app.name)
    runtime.changes.announce(APPLICATIONS)  # every process forgets it: its credentials stop working
    return app
