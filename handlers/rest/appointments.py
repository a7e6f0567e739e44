"""`GET /v1/appointments/{svcOrganizationId}`: a page of the latest nightly snapshot."""
from __future__ import annotations

from handlers.rest.base import PartnerApiHandler
from partner_api.appointments import appointments_page


class AppointmentsHandler(PartnerApiHandler):
    operations = {"GET": "appointments"}

    async def get(self, organization_id):
        self.write_json(await self.run(appointments_page, self.runtime, self.partner_app, organization_id,
                                       self.query_params()))


def routes(runtime) -> list:
    return [(r"/v1/appointments/([^/]+)", AppointmentsHandler)]
