"""`GET /v1/appointments/{svcOrganizationId}`: a page of the latest nightly snapshot."""
from __future__ import annotations

from handlers.rest.base import PartnerApiHandler
from partner_api.appointments import appointments_page
from partner_api.disclosure import describe_page


class AppointmentsHandler(PartnerApiHandler):
    path_names = ("svcOrganizationId",)
    operations = {"GET": "appointments"}

    async def get(self, organization_id):
        query = self.query_params()
        self.write_json(await self.disclose("appointments", organization_id, describe_page, 200, appointments_page,
                                            self.runtime, self.partner_app, organization_id, query,
                                            resource_type="Appointment"))


def routes(runtime) -> list:
    return [(r"/v1/appointments/([^/]+)", AppointmentsHandler)]
