"""Operations endpoints: `/healthz` (the process is up), `/readyz` (its dependencies are
reachable), `/metrics` (Prometheus). Keep them off the public internet (see deploy/nginx)."""
from __future__ import annotations

from handlers.base import BaseHandler
from ops import metrics
from ops.readiness import readiness


class HealthHandler(BaseHandler):
    def get(self):
        self.set_header("Cache-Control", "no-store")
        self.write_json({"status": "ok"})


class ReadinessHandler(BaseHandler):
    def get(self):
        ready, checks = readiness(self.runtime)
        self.set_header("Cache-Control", "no-store")
        self.write_json({"status": "ready" if ready else "unavailable", "checks": checks},
                        status=200 if ready else 503)


class MetricsHandler(BaseHandler):
    def get(self):
        body, content_type = metrics.exposition()
        self.set_header("Content-Type", content_type)
        self.set_header("Cache-Control", "no-store")
        self.finish(body)


def routes(runtime) -> list:
    return [
        (r"/healthz", HealthHandler),
        (r"/readyz", ReadinessHandler),
        (r"/metrics", MetricsHandler),
    ]
