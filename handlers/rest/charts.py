"""Chart retrieval requests and their download URLs."""
from __future__ import annotations

import tornado.ioloop

from handlers.rest.base import PartnerApiHandler
from partner_api.charts import PENDING_RETRY_AFTER, create_request, download_target, request_status, signed_download


class ChartRequestsHandler(PartnerApiHandler):
    operations = {"POST": "chart_request_create"}

    def post(self):
        self.write_json(create_request(self.runtime, self.partner_app, self.json_body()), status=202)


class ChartRequestHandler(PartnerApiHandler):
    operations = {"GET": "chart_request_status"}

    def get(self, request_id):
        self.write_json(request_status(self.partner_app, request_id))


class DownloadUrlHandler(PartnerApiHandler):
    operations = {"GET": "chart_download_url"}

    async def get(self, request_id):
        key, pending = download_target(self.partner_app, request_id)
        if pending is not None:
            self.set_header("Retry-After", str(PENDING_RETRY_AFTER))
            return self.write_json(pending, status=202)
        body = await tornado.ioloop.IOLoop.current().run_in_executor(None, signed_download, self.runtime, key)
        self.write_json(body)


def routes(runtime) -> list:
    return [
        (r"/v1/chart-retrieval/requests", ChartRequestsHandler),
        (r"/v1/chart-retrieval/requests/([^/]+)", ChartRequestHandler),
        (r"/v1/chart-retrieval/download-url/([^/]+)", DownloadUrlHandler),
    ]
