"""Listings of an application's organizations and users, and its activation status per organization."""
from __future__ import annotations

from handlers.rest.base import PartnerApiHandler
from partner_api.directory import own_organizations, own_users, update_activation


class OrganizationsHandler(PartnerApiHandler):
    path_names = ("applicationId",)
    operations = {"GET": "organizations"}

    async def get(self, application_id):
        self.write_json(await self.run(own_organizations, self.partner_app, application_id))


class UsersHandler(PartnerApiHandler):
    path_names = ("applicationId", "organizationId")
    operations = {"GET": "users"}

    async def get(self, application_id, organization_id):
        self.write_json(await self.run(own_users, self.partner_app, application_id, organization_id))


class ActivationStatusHandler(PartnerApiHandler):
    path_names = ("applicationId", "organizationId")
    operations = {"PUT": "activation_status"}

    async def put(self, application_id, organization_id):
        body = self.json_body()
        self.write_json(await self.run(update_activation, self.runtime, self.partner_app, application_id,
                                       organization_id, body))


def routes(runtime) -> list:
    base = r"/v1/applications/([^/]+)/organizations"
    return [
        (base, OrganizationsHandler),
        (base + r"/([^/]+)/users", UsersHandler),
        (base + r"/([^/]+)/activation-status", ActivationStatusHandler),
    ]
