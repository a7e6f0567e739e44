"""`POST /v1/invitations` and the invitation link's page (`GET /invitations/{token}`)."""
from __future__ import annotations

from urllib.parse import urlencode

from handlers.base import BaseHandler
from handlers.rest.base import PartnerApiHandler
from partner_api.invitations import accept, invite


class InvitationsHandler(PartnerApiHandler):
    operations = {"POST": "invitations"}

    async def post(self):
        body = self.json_body()
        self.write_json(await self.run(invite, self.runtime, self.partner_app, body), status=201)


class InvitationLinkHandler(BaseHandler):
    """The link in the invitation: works once, then sends the user to their sandbox hub."""

    async def get(self, token):
        user = await self.run(accept, self.runtime, token)
        self.set_header("Cache-Control", "no-store")
        self.redirect(f"{self.svc_settings.public_url}/sandbox/hub?{urlencode({'user': user.id})}")


def routes(runtime) -> list:
    return [(r"/v1/invitations", InvitationsHandler), (r"/invitations/([^/]+)", InvitationLinkHandler)]
