"""The testing operation: create a launch with a sandbox settings token (`POST /v1/sandbox/launches`)."""
from __future__ import annotations

from handlers.base import BaseHandler
from lifecycle.launches import create_launch
from lifecycle.sandbox import require_sandbox_on, sandbox_session
from oauth.params import text_param
from oauth.resource import bearer_value


class SandboxLaunchesHandler(BaseHandler):
    async def prepare(self):
        super().prepare()
        require_sandbox_on(self.svc_settings)  # 404 while the sandbox is off

    async def post(self):
        token = bearer_value(self.request.headers.get("Authorization"))
        user, auth_time = await self.run(sandbox_session, self.runtime, token)
        client_id = text_param(self.body_params(allow_form=False), "client_id", max_length=64)
        launch, url = await self.run(create_launch, self.runtime, user, client_id, auth_time)
        self.set_header("Cache-Control", "no-store")
        self.write_json({"launch_id": launch.id, "launch_url": url,
                         "expires_in": self.svc_settings.launch_ttl}, status=201)


def routes(runtime) -> list:
    return [(r"/v1/sandbox/launches", SandboxLaunchesHandler)]
