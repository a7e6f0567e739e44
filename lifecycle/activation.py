"""The application activation status of one installation (spec: States and transitions): what each
status allows, the installation an app has in a clinic, and the transitions.

What a status allows, asked by every path that opens or uses an app (the hub, launches, authorize,
the token exchange, userinfo, the FHIR API, the partner API, billing):
- no status yet (before the first completed SDK initialization) and `Enabled`: the app opens and
  its tokens work (`may_open`, `may_use`);
- `Disabled`: greyed out in the hub, cannot be opened, and its tokens reach nothing of the clinic:
  every path answers 403 `application_disabled` (`require`), in its own error shape.
`oauth/` and `fhir_api/` sit below `lifecycle/` and reach this module as `runtime.activation`
(as they reach `runtime.fhir_base_url`).

(none) -> Disabled happens at the first completed SDK initialization (`lifecycle.verification`); a
backend app (SMART Backend Services) has none: `installs create` makes it Disabled, and its status
may be set at once (an installation made before its keys were registered: from none).
After that the application sets `Enabled` or `Disabled` itself; the first `Enabled` starts the
30-day free trial of that installation (`billing.free_trial`). Every change is audited (it decides billing).
"""
from __future__ import annotations

from billing.free_trial import start_trial
from models.application import ACTIVATION_STATUSES, DISABLED, ENABLED, Application, Installation
from models.audit import AuditEvent
from models.directory import Organization
from models.ids import ID_RULE, is_id
from errors import ApiError
from models.refresh import SmartGrant
from oauth.smart_grants import revoke_grants

DISABLED_MESSAGE = f"The application is {DISABLED} in this organization"
NOT_INSTALLED = "The application is not installed in this organization."
OPEN, USE = "open", "use"


def may_open(status: str | None) -> bool:
    """May a user open the app (the hub, a launch, authorize)? Not while `Disabled`."""
    return status != DISABLED


def may_use(status: str | None) -> bool:
    """May the app's tokens be issued and used (token exchange, userinfo, FHIR API, partner API)?"""
    return status != DISABLED


def is_billable_status(status: str | None) -> bool:
    """Billing applies only while `Enabled` (spec: "billing applies to users returned authorized while Enabled")."""
    return status == ENABLED


def disabled_error(purpose: str) -> ApiError:
    verb = "cannot be opened" if purpose == OPEN else "cannot be used"
    return ApiError(403, "application_disabled", f"{DISABLED_MESSAGE} and {verb}.")


def require(installation: Installation | None, purpose: str) -> Installation:
    """`installation` when it exists and its status allows `purpose` (OPEN or USE); else 403
    `not_installed` or `application_disabled`."""
    if installation is None:
        raise ApiError(403, "not_installed", NOT_INSTALLED)
    allowed = may_open if purpose == OPEN else may_use
    if not allowed(installation.activation_status):
        raise disabled_error(purpose)
    return installation


def installation_of(application_id: str, organization_id, purpose: str | None = None,
                    name: str = "organizationId") -> Installation:
    """The app's installation in the clinic, else: an organization id that is no id 400, an
    unknown organization 404 `organization_not_found`, not installed there 403 `not_installed`;
    with `purpose`, a status that does not allow it 403 `application_disabled`."""
    if not is_id(organization_id):
        raise ApiError(400, "invalid_path_parameter", f"{name} must be {ID_RULE}.")
    installation = Installation.find(application_id, organization_id)
    if installation is None and Organization.get_or_none(Organization.id == organization_id) is None:
        raise ApiError(404, "organization_not_found", f"No organization has id {organization_id!r}.")
    if installation is None or purpose is not None:
        return require(installation, purpose)
    return installation


def end_installation_grants(runtime, application_id: str, organization_id: str) -> int:
    """The installation became `Disabled` (set by the app, or at its first SDK initialization):
    the app's SMART refresh-token grants in the clinic end, and re-enabling revives none."""
    return revoke_grants(runtime, (SmartGrant.application == application_id)
                         & (SmartGrant.organization == organization_id), "installation_disabled")


def set_activation_status(runtime, installation: Installation, status, actor: str) -> Installation:
    if status not in ACTIVATION_STATUSES:
        raise ApiError(400, "invalid_status", f"status must be one of {', '.join(ACTIVATION_STATUSES)}.")
    current = Installation.get_by_id(installation.id)
    if current.activation_status is None and not Application.get_by_id(current.application_id).is_backend:
        # A backend app (SMART Backend Services) has no SDK initialization: its status is set directly.
        raise ApiError(409, "not_initialized",
                       "The activation status can be set only after the application's first SDK initialization "
                       "in this organization.")
    with runtime.db.atomic():
        Installation.update(activation_status=status).where(Installation.id == current.id).execute()
        if status == ENABLED:
            start_trial(current.id, runtime.clock.now())
        else:
            end_installation_grants(runtime, current.application_id, current.organization_id)
        AuditEvent.record(actor, "installation.activation_status_set",
                          f"{current.application_id}/{current.organization_id}",
                          before=current.activation_status, after=status)
    return Installation.get_by_id(current.id)
