"""What the developer console shows about one application (plain functions, no HTTP), read from the same functions as the
partner REST API (organizations, users, billing) so both always agree. The console is the
partner's other interface; the REST API's access rule is replaced by the developer's
(`console.accounts.developer_application`)."""
from __future__ import annotations

from urllib.parse import urlsplit

import peewee

from connectors.fhir.profiles import profile_named
from lifecycle.billing import billing_report, report_rows
from models.application import Application, Installation
from models.directory import Organization
from models.audit import AuditEvent
from billing.free_trial import trial_state
from partner_api.directory import organizations_of, users_of
from models.directory import User
from oauth.smart_grants import grant_dict, list_grants


def installations_view(runtime, app: Application) -> list[dict]:
    """Each clinic: the REST listing's fields, the trial state and its users."""
    now = runtime.clock.now()
    # One query for every clinic's trial start, not one per clinic.
    trial_started = {i.organization_id: i.trial_started_at for i in Installation.select(
        Installation.organization, Installation.trial_started_at).where(Installation.application == app.id)}
    organizations = organizations_of(app)
    ehrs = {o.id: ehr_label(o) for o in Organization.select(Organization.id, Organization.ehr, Organization.ehr_url,
                                                            Organization.fhir_profile)
            .where(Organization.id.in_([org["id"] for org in organizations]))}
    rows = []
    for org in organizations:
        started = trial_started.get(org["id"])
        trial = trial_state(app.billing_plan, started, now)
        rows.append({**org, "is_free_trial": trial.is_free_trial, "days_left": trial.days_until_end_of_trial,
                     "trial_started_at": started, "users": users_of(app, org["id"]), "ehr": ehrs.get(org["id"], "")})
    return rows


def ehr_label(org: Organization) -> str:
    """Which EHR the clinic is on, as a partner developer reads it."""
    if org.ehr == "fhir":  # with its vendor profile, read-only (the operator sets it: orgs update --fhir-profile)
        profile = profile_named(org.fhir_profile)
        vendor = "" if profile.name == "generic" else f", {profile.label} profile"
        return f"FHIR R4 ({urlsplit(org.ehr_url).hostname or org.ehr_url}{vendor})"
    return "Sandbox EHR" if org.ehr == "sandbox" else org.ehr


def billing_csv_rows(app: Application, month: str) -> list[list[str]]:
    """One row per billable user, as `svc-auth billing report --format csv` writes them."""
    return report_rows(billing_report(month, app.id))


def audit_view(app: Application, limit: int = 200) -> list[AuditEvent]:
    """The application's audit trail, newest first: secret steps, manifest and activation changes."""
    prefix = app.id + "/"  # activation events name "application/organization"
    return list(AuditEvent.select()
                .where((AuditEvent.subject == app.id)
                       | (peewee.fn.SUBSTR(AuditEvent.subject, 1, len(prefix)) == prefix))
                .order_by(AuditEvent.at.desc(), AuditEvent.id.desc()).limit(limit))


def grants_view(runtime, app: Application) -> list[dict]:
    """The app's live SMART refresh-token grants, by clinic (clinic name order), each with its user's name."""
    grants = list_grants(runtime, application_id=app.id)
    users = {u.id: u for u in User.select().where(User.id.in_({g.user_id for g in grants}))} if grants else {}
    names = {o.id: o.name for o in Organization.select(Organization.id, Organization.name)
             .where(Organization.id.in_({g.organization_id for g in grants}))} if grants else {}
    clinics: dict[str, dict] = {}
    for grant in grants:
        clinic = clinics.setdefault(grant.organization_id, {"id": grant.organization_id,
                                                            "name": names.get(grant.organization_id, ""),
                                                            "grants": []})
        user = users.get(grant.user_id)
        clinic["grants"].append({**grant_dict(grant), "user": user.display_name if user else grant.user_id})
    return sorted(clinics.values(), key=lambda c: (c["name"], c["id"]))
