"""`POST /v1/invitations` and the invitation link's page (`GET /invitations/{token}`)."""
from __future__ import annotations

from handlers.base import BaseHandler
from handlers.rest.base import PartnerApiHandler
from handlers.sandbox_hub import set_session_cookie
from hub.sandbox import is_sandbox_user, open_sandbox_session
from partner_api.invitations import accept, invite


class InvitationsHandler(PartnerApiHandler):
    operations = {"POST": "invitations"}

    async def post(self):
        body = self.json_body()
        self.write_json(await self.run(invite, self.runtime, self.partner_app, body), status=201)


class InvitationLinkHandler(BaseHandler):
    """The link in the invitation: works once, then signs the user in to their sandbox hub
    (a sandbox session, as a sign-in link opens). With the sandbox off it only activates them."""

    async def get(self, token):
        user = await self.run(accept, self.runtime, token)
        self.no_store()
        if not self.svc_settings.sandbox or not await self.run(is_sandbox_user, user):
            return self.write_json({"status": "accepted", "user_id": user.id,
                                    "message": "Your invitation is accepted."})
        session_id = await self.run(open_sandbox_session, self.runtime, user)
        set_session_cookie(self, session_id)
        self.redirect(f"{self.svc_settings.public_url}/sandbox/hub")


def routes(runtime) -> list:
    return [(r"/v1/invitations", InvitationsHandler), (r"/invitations/([^/]+)", InvitationLinkHandler)]
