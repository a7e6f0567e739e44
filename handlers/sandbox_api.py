"""The testing operation: create a launch with a sandbox settings token (`POST /v1/sandbox/launches`)."""
from __future__ import annotations

from handlers.base import BaseHandler
from hub.launches import create_launch, valid_patient_id
from hub.sandbox import require_sandbox_on, sandbox_user_and_auth_time
from oauth.params import text_param


class SandboxLaunchesHandler(BaseHandler):
    async def prepare(self):
        super().prepare()
        require_sandbox_on(self.svc_settings)  # 404 while the sandbox is off

    async def post(self):
        user, auth_time = await self.run(sandbox_user_and_auth_time, self.runtime, self.request.headers.get("Authorization"))
        body = self.body_params(allow_form=False)
        client_id = text_param(body, "client_id", max_length=64)
        patient_id = valid_patient_id(body.get("patient_id"))  # optional: the launch's patient context
        launch, url = await self.run(create_launch, self.runtime, user, client_id, auth_time, patient_id)
        self.no_store()
        self.write_json({"launch_id": launch.id, "launch_url": url,
                         "expires_in": self.svc_settings.launch_ttl}, status=201)


def routes(runtime) -> list:
    return [(r"/v1/sandbox/launches", SandboxLaunchesHandler)]
