"""`GET /v1/applications/{applicationId}/billing?month=YYYY-MM`: billable users per organization."""
from __future__ import annotations

from handlers.rest.base import PartnerApiHandler
from partner_api.billing import own_billing


class BillingHandler(PartnerApiHandler):
    path_names = ("applicationId",)
    operations = {"GET": "billing"}

    async def get(self, application_id):
        month = self.query_params().get("month")
        self.write_json(await self.run(own_billing, self.partner_app, application_id, month))


def routes(runtime) -> list:
    return [(r"/v1/applications/([^/]+)/billing", BillingHandler)]
