"""Listings of an application's organizations and users, and its activation status per organization."""
from __future__ import annotations

from handlers.rest.base import PartnerApiHandler
from lifecycle.activation import set_activation_status
from models.clock import utc_iso
from oauth.errors import ApiError
from partner_api.access import installation_of, own_application
from partner_api.directory import organizations_of, users_of


class OrganizationsHandler(PartnerApiHandler):
    operations = {"GET": "organizations"}

    def get(self, application_id):
        app = own_application(self.partner_app, application_id)
        self.write_json(organizations_of(app))


class UsersHandler(PartnerApiHandler):
    operations = {"GET": "users"}

    def get(self, application_id, organization_id):
        app = own_application(self.partner_app, application_id)
        installation_of(app, organization_id)
        self.write_json(users_of(app, organization_id))


class ActivationStatusHandler(PartnerApiHandler):
    operations = {"PUT": "activation_status"}

    def put(self, application_id, organization_id):
        app = own_application(self.partner_app, application_id)
        installation = installation_of(app, organization_id)
        body = self.json_body()
        unknown = sorted(set(body) - {"status"})
        if unknown:
            raise ApiError(400, "unknown_field", f"Unknown field(s): {', '.join(unknown)}.")
        installation = set_activation_status(installation, body.get("status"), actor=app.id)
        self.write_json({"status": installation.activation_status,
                         "trial_started_at": utc_iso(installation.trial_started_at)})


def routes(runtime) -> list:
    base = r"/v1/applications/([^/]+)/organizations"
    return [
        (base, OrganizationsHandler),
        (base + r"/([^/]+)/users", UsersHandler),
        (base + r"/([^/]+)/activation-status", ActivationStatusHandler),
    ]
