"""One application's pages: manifest and secrets, installations, billing (+ CSV) and audit.

Every request re-checks that the signed-in developer was invited to the application (404 if not).
Changes go through the lifecycle functions the CLI and REST API use, with the developer as actor."""
from __future__ import annotations

import csv
import io
import re

from handlers.console.base import ConsoleHandler
from lifecycle.activation import installation_of, set_activation_status
from lifecycle.billing import parse_month
from partner_api.billing import billing_of
from console.views import audit_view, billing_csv_rows, grants_view, installations_view
from console.accounts import actor_of
from lifecycle.applications import declared_smart_scopes, set_offline_access_ttl, set_public, set_smart_scopes, \
    whole_seconds
from lifecycle.grants import end_grants
from lifecycle.manifest import PERMISSION_GROUPS, ManifestInvalid, manifest_of, update_manifest
from lifecycle.manifest_validation import validate
from oauth.secret_rotation import activate_fallback_secret, generate_fallback_secret
from errors import ApiError
from models.ids import is_id

ACTIVATION_WARNING = ("Activating the fallback secret before your backend retries with the fallback "
                      "breaks integrations: the current secret stops working at once.")


SMART_FIELDS = ("smart_scopes", "allowed_origins", "offline_access_ttl")
"""The fields of the SMART settings form (beside `public`), whose errors it shows (CONTRACTS.md:
`Public client`, `SMART scopes`, `Allowed origins`, `Save SMART settings`)."""


def origins_of(text: str) -> list[str]:
    """The `Allowed origins` field: origins one per line, or separated by spaces or commas (an
    origin holds none of them)."""
    return [origin for origin in re.split(r"[\s,]+", text) if origin]


class AppPage(ConsoleHandler):
    def render_app(self, app, status=200, form=None, errors=None, **extra):
        smart_form = extra.pop("smart_form", None) or {
            "public": app.public, "smart_scopes": app.smart_scopes,
            "allowed_origins": "\n".join(app.allowed_origins or []),
            "offline_access_ttl": str(app.offline_access_ttl or "")}
        if "allowed_origins" in (errors or {}) and form is not None:  # a manifest POST that named origins
            smart_form["allowed_origins"] = "\n".join(form.get("allowed_origins") or [])
        self.page("app.html", status, app=app, section="settings", form=form or manifest_of(app),
                  errors=errors or {}, groups=PERMISSION_GROUPS, warning=ACTIVATION_WARNING, smart_form=smart_form,
                  smart_fields=SMART_FIELDS,
                  new_secret=extra.pop("new_secret", None),
                  fallback_secret=extra.pop("fallback_secret", None), confirm=extra.pop("confirm", False),
                  notice=extra.pop("notice", self.get_query_argument("notice", "")), **extra)


class AppHandler(AppPage):
    """`/console/apps/{id}`: the manifest form (POST saves it) and the secret rotation steps. The
    allowed origins are edited with the SMART settings; a POST that names them here still sets them."""

    async def get(self, application_id):
        app = await self.own_application(application_id)
        self.render_app(app)

    async def post(self, application_id):
        app = await self.own_application(application_id)
        form = {"name": self.form("name"), "launch_url": self.form("launch_url"),
                "redirect_uri": self.form("redirect_uri"), "token_endpoint": self.form("token_endpoint"),
                "user_fields": self.form_list("user_fields")}
        if self.get_body_argument("allowed_origins", None) is not None:
            form["allowed_origins"] = origins_of(self.form("allowed_origins"))
        try:
            await self.run(update_manifest, self.runtime, app.id, actor_of(self.developer), **form)
        except ManifestInvalid as exc:
            return self.render_app(app, 400, form=form, errors=exc.fields)
        self.redirect(f"/console/apps/{app.id}?notice=saved", status=303)


class SmartSettingsHandler(AppPage):
    """`/console/apps/{id}/smart`: client type (the `Public client` checkbox), declared SMART scopes,
    allowed origins and the offline_access lifetime, validated by the same lifecycle functions as
    `apps update`; nothing is saved while a field is wrong. A POST without `allowed_origins` leaves them."""

    async def post(self, application_id):
        app = await self.own_application(application_id)
        public = self.form("public") == "on"
        scopes, ttl = self.form("smart_scopes"), self.form("offline_access_ttl")
        origins_text = self.get_body_argument("allowed_origins", None)
        smart_form = {"public": public, "smart_scopes": scopes, "offline_access_ttl": ttl,
                      "allowed_origins": "\n".join(app.allowed_origins or []) if origins_text is None else origins_text}
        errors = {}
        try:
            declared_smart_scopes(scopes)
        except ApiError as exc:
            errors["smart_scopes"] = exc.message
        origins = None if origins_text is None else origins_of(origins_text)
        if origins is not None:
            try:
                validate({"allowed_origins": origins})
            except ManifestInvalid as exc:
                errors.update(exc.fields)
        seconds = whole_seconds(ttl) if ttl.strip() else None
        if ttl.strip() and seconds is None:
            errors["offline_access_ttl"] = "A whole number of seconds, or empty for the default (90 days)."
        actor = actor_of(self.developer)
        if not errors:
            try:
                await self.run(set_offline_access_ttl, self.runtime, app.id, seconds, actor)
            except ApiError as exc:
                errors["offline_access_ttl"] = exc.message
        if errors:
            return self.render_app(app, 400, errors=errors, smart_form=smart_form)
        await self.run(set_smart_scopes, self.runtime, app.id, scopes, actor)
        if origins is not None:
            await self.run(update_manifest, self.runtime, app.id, actor, allowed_origins=origins)
        secret = None
        if public != app.public:
            app, secret = await self.run(set_public, self.runtime, app.id, public, actor)
        if secret:  # confidential again: the new secret is shown once, in this response only
            return self.render_app(await self.own_application(application_id), new_secret=secret, notice="smart")
        self.redirect(f"/console/apps/{app.id}?notice=smart", status=303)


class GrantsHandler(ConsoleHandler):
    """`/console/apps/{id}/grants`: the app's live refresh-token grants per clinic, each with Revoke."""

    async def get(self, application_id):
        app = await self.own_application(application_id)
        clinics = await self.run(grants_view, self.runtime, app)
        self.page("grants.html", app=app, section="grants", clinics=clinics,
                  notice=self.get_query_argument("notice", ""))


class RevokeGrantHandler(ConsoleHandler):
    async def post(self, application_id, grant_id):
        app = await self.own_application(application_id)
        # Only this app's grants: the filter names the application too.
        count = await self.run(end_grants, self.runtime, actor_of(self.developer), grant_id=grant_id,
                               application_id=app.id)
        if count == 0:  # already ended, or not this app's: nothing to tell apart
            raise ApiError(404, "not_found", "No such active grant.")
        self.redirect(f"/console/apps/{app.id}/grants?notice=revoked", status=303)


class FallbackSecretHandler(AppPage):
    """Rotation step 1: the new secret is shown once, in this response only."""

    async def post(self, application_id):
        app = await self.own_application(application_id)
        secret = await self.run(generate_fallback_secret, self.runtime, app.id, actor_of(self.developer))
        app = await self.own_application(application_id)
        self.render_app(app, fallback_secret=secret)


class ActivateFallbackHandler(AppPage):
    """Rotation step 3: first the warning and a `Confirm activation` button, then the change."""

    async def post(self, application_id):
        app = await self.own_application(application_id)
        if self.form("confirm") != "yes":
            return self.render_app(app, confirm=True)
        try:
            await self.run(activate_fallback_secret, self.runtime, app.id, actor_of(self.developer))
        except ApiError as exc:
            return self.render_app(app, 409, errors={"secret": exc.message})
        self.redirect(f"/console/apps/{app.id}?notice=activated", status=303)


class InstallationsHandler(ConsoleHandler):
    async def get(self, application_id):
        await self.show(await self.own_application(application_id))

    async def show(self, app, errors=None, status=200):
        rows = await self.run(installations_view, self.runtime, app)
        self.page("installations.html", status, app=app, section="installations", rows=rows, errors=errors or {},
                  notice=self.get_query_argument("notice", ""))


class ActivationHandler(InstallationsHandler):
    """The Enable/Disable switch of one clinic: the REST operation's rule (`set_activation_status`)."""

    async def get(self, application_id, organization_id):
        """The list (a reload of the form's target); a clinic id that is no id is 404."""
        app = await self.own_application(application_id)
        if not is_id(organization_id):
            raise ApiError(404, "not_installed", "No such clinic.")
        await self.show(app)

    async def post(self, application_id, organization_id):
        app = await self.own_application(application_id)
        try:
            installation = await self.run(installation_of, app.id, organization_id)
        except ApiError as exc:  # a page never tells an unknown clinic from one the app is not in
            raise ApiError(404, "not_installed", exc.message) from None
        try:
            await self.run(set_activation_status, self.runtime, installation, self.form("status"),
                           actor_of(self.developer))
        except ApiError as exc:
            return await self.show(app, {organization_id: exc.message}, exc.status)
        self.redirect(f"/console/apps/{app.id}/installations?notice=saved", status=303)


class BillingHandler(ConsoleHandler):
    def month(self) -> str:
        return self.get_query_argument("month", "") or self.runtime.clock.now().strftime("%Y-%m")

    async def get(self, application_id):
        app = await self.own_application(application_id)
        month = self.month()
        try:
            parse_month(month)
        except ApiError as exc:
            return self.page("billing.html", 400, app=app, section="billing", month=month, bill=None,
                             error=exc.message)
        bill = await self.run(billing_of, app, month)  # the object of GET /v1/applications/{id}/billing
        self.page("billing.html", app=app, section="billing", month=month, bill=bill, error=None)


class BillingCsvHandler(BillingHandler):
    async def get(self, application_id):
        app = await self.own_application(application_id)
        month = parse_month(self.month())
        rows = await self.run(billing_csv_rows, app, month)
        out = io.StringIO()
        csv.writer(out).writerows(rows)
        self.set_header("Content-Type", "text/csv; charset=UTF-8")
        self.set_header("Content-Disposition", f'attachment; filename="billing-{app.id}-{month}.csv"')
        self.finish(out.getvalue())


class AuditHandler(ConsoleHandler):
    async def get(self, application_id):
        app = await self.own_application(application_id)
        events = await self.run(audit_view, app)
        self.page("audit.html", app=app, section="audit", events=events)


def routes() -> list:
    base = r"/console/apps/([^/]+)"
    return [
        (base, AppHandler),
        (base + r"/smart", SmartSettingsHandler),
        (base + r"/grants", GrantsHandler),
        (base + r"/grants/([^/]+)/revoke", RevokeGrantHandler),
        (base + r"/secret/fallback", FallbackSecretHandler),
        (base + r"/secret/activate", ActivateFallbackHandler),
        (base + r"/installations", InstallationsHandler),
        (base + r"/installations/([^/]+)/status", ActivationHandler),
        (base + r"/billing", BillingHandler),
        (base + r"/billing\.csv", BillingCsvHandler),
        (base + r"/audit", AuditHandler),
    ]
