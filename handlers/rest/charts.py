"""Chart retrieval requests and their download URLs."""
from __future__ import annotations

from handlers.rest.base import PartnerApiHandler
from partner_api.charts import PENDING_RETRY_AFTER, create_request, download_target, request_status, signed_download


class ChartRequestsHandler(PartnerApiHandler):
    operations = {"POST": "chart_request_create"}

    async def post(self):
        body = self.json_body()
        self.write_json(await self.run(create_request, self.runtime, self.partner_app, body), status=202)


class ChartRequestHandler(PartnerApiHandler):
    operations = {"GET": "chart_request_status"}

    async def get(self, request_id):
        self.write_json(await self.run(request_status, self.partner_app, request_id))


class DownloadUrlHandler(PartnerApiHandler):
    operations = {"GET": "chart_download_url"}

    async def get(self, request_id):
        key, pending = await self.run(download_target, self.partner_app, request_id)
        if pending is not None:
            self.set_header("Retry-After", str(PENDING_RETRY_AFTER))
            return self.write_json(pending, status=202)
        body = await self.run(signed_download, self.runtime, key)  # S3 presigning, or the test-mode ZIP build
        self.write_json(body)


def routes(runtime) -> list:
    return [
        (r"/v1/chart-retrieval/requests", ChartRequestsHandler),
        (r"/v1/chart-retrieval/requests/([^/]+)", ChartRequestHandler),
        (r"/v1/chart-retrieval/download-url/([^/]+)", DownloadUrlHandler),
    ]
