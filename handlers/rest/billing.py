"""`GET /v1/applications/{applicationId}/billing?month=YYYY-MM`: billable users per organization."""
from __future__ import annotations

from handlers.rest.base import PartnerApiHandler
from partner_api.access import own_application
from partner_api.billing import billing_of


class BillingHandler(PartnerApiHandler):
    operations = {"GET": "billing"}

    def get(self, application_id):
        app = own_application(self.partner_app, application_id)
        self.write_json(billing_of(app, self.query_params().get("month")))


def routes(runtime) -> list:
    return [(r"/v1/applications/([^/]+)/billing", BillingHandler)]
