"""Chart retrieval requests and their download URLs."""
from __future__ import annotations

from handlers.rest.base import PartnerApiHandler
from partner_api.charts import PENDING_RETRY_AFTER, create_request, download_url, request_status
from partner_api.disclosure import chart_of, chart_request_patient, describe_chart_request


class ChartRequestsHandler(PartnerApiHandler):
    operations = {"POST": "chart_request_create"}

    async def post(self):
        body = self.json_body()
        patient = chart_request_patient(body)
        self.write_json(await self.disclose(
            "chart.request", body.get("svc_organization_id"), lambda answer: describe_chart_request(answer, patient),
            202, create_request, self.runtime, self.partner_app, body,
            resource_type="ChartRequest", patients=(patient,) if patient else ()), status=202)


class ChartRequestHandler(PartnerApiHandler):
    path_names = ("requestId",)
    operations = {"GET": "chart_request_status"}

    async def get(self, request_id):
        self.write_json(await self.run(request_status, self.partner_app, request_id))


class DownloadUrlHandler(PartnerApiHandler):
    path_names = ("requestId",)
    operations = {"GET": "chart_download_url"}

    async def get(self, request_id):
        organization_id, patient_id, _ = await self.run(chart_of, self.partner_app.id, request_id)
        pending, body = await self.disclose(
            "chart.url", organization_id, lambda answer: None if answer[0] else ([patient_id], [request_id]), 200,
            download_url, self.runtime, self.partner_app, request_id,
            resource_type="ChartRequest", resource_ids=(request_id,), patients=(patient_id,) if patient_id else ())
        if pending:
            self.set_header("Retry-After", str(PENDING_RETRY_AFTER))
            return self.write_json(body, status=202)
        self.write_json(body)


def routes(runtime) -> list:
    return [
        (r"/v1/chart-retrieval/requests", ChartRequestsHandler),
        (r"/v1/chart-retrieval/requests/([^/]+)", ChartRequestHandler),
        (r"/v1/chart-retrieval/download-url/([^/]+)", DownloadUrlHandler),
    ]
