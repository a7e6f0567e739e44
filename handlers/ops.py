"""Operations endpoints: `/healthz` (the process is up), `/readyz` (its dependencies are
reachable), `/metrics` (Prometheus). Keep them off the public internet (see deploy/nginx)."""
from __future__ import annotations

from handlers.base import BaseHandler


class HealthHandler(BaseHandler):
    async def get(self):  # no I/O: answers even while every dependency is down
        self.no_store()
        self.write_json({"status": "ok"})


class ReadinessHandler(BaseHandler):
    async def get(self):
        ready, checks = await self.runtime.readiness.answer(self.runtime)  # runs on the pool; shared, cached 1 s
        self.no_store()
        self.write_json({"status": "ready" if ready else "unavailable", "checks": checks},
                        status=200 if ready else 503)


class MetricsHandler(BaseHandler):
    async def get(self):
        self.runtime.metrics.flush()  # this loop turn's counts first
        body, content_type = await self.run(self.runtime.metrics.exposition)  # queue depths may ask Redis
        self.set_header("Content-Type", content_type)
        self.no_store()
        self.finish(body)


def routes(runtime) -> list:
    return [
        (r"/healthz", HealthHandler),
        (r"/readyz", ReadinessHandler),
        (r"/metrics", MetricsHandler),
    ]
