"""`POST /v1/invitations` and the invitation link's page (`GET /invitations/{token}`)."""
from __future__ import annotations

from urllib.parse import urlencode

from handlers.base import BaseHandler
from handlers.rest.base import PartnerApiHandler
from partner_api.invitations import accept, invite


class InvitationsHandler(PartnerApiHandler):
    operations = {"POST": "invitations"}

    def post(self):
        self.write_json(invite(self.runtime, self.partner_app, self.json_body()), status=201)


class InvitationLinkHandler(BaseHandler):
    """The link in the invitation: works once, then sends the user to their sandbox hub."""

    def get(self, token):
        user = accept(self.runtime, token)
        self.set_header("Cache-Control", "no-store")
        self.redirect(f"{self.svc_settings.public_url}/sandbox/hub?{urlencode({'user': user.id})}")


def routes(runtime) -> list:
    return [(r"/v1/invitations", InvitationsHandler), (r"/invitations/([^/]+)", InvitationLinkHandler)]
