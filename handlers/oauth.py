"""The authorization server endpoints, served under each address variant (`/v1`, `/os-api/v2`)."""
from __future__ import annotations

import html

from handlers.base import BaseHandler
from oauth.authorization_code import AuthorizationRequest
from oauth.clients import authenticate_client
from oauth.errors import ApiError, AuthorizeError
from oauth.redirects import with_query
from oauth.params import text_param
from oauth.resource import active_client_token, active_user_token, bearer_value, introspection_response, userinfo
from oauth.revocation import revoke_token
from oauth.token_endpoint import answers_in_memory, token_response
from oauth.variants import VARIANTS
from lifecycle.verification import platform_introspection


class VariantHandler(BaseHandler):
    def initialize(self, variant):
        self.variant = variant


class AuthorizeHandler(VariantHandler):
    async def get(self):
        try:
            location = await self.run(AuthorizationRequest(self.runtime).issue_code, self.query_params())
        except AuthorizeError as err:
            if err.redirect_uri:
                location = with_query(err.redirect_uri, error=err.error, error_description=err.description,
                                      state=err.state)
            else:
                return self.render_untrusted_error(err)
        self.set_header("Cache-Control", "no-store")
        self.redirect(location)

    def render_untrusted_error(self, err: AuthorizeError):
        self.set_status(400)
        self.set_header("Cache-Control", "no-store")
        if "application/json" in (self.request.headers.get("Accept") or ""):
            return self.write_json({"error": err.error, "error_description": err.description,
                                    "message": err.description}, 400)
        self.set_header("Content-Type", "text/html; charset=UTF-8")
        self.finish(f"<!doctype html><title>Authorization error</title><h1>Authorization error</h1>"
                    f"<p><code>{html.escape(err.error)}</code>: {html.escape(err.description)}</p>")


class TokenHandler(VariantHandler):
    async def post(self):
        self.set_header("Cache-Control", "no-store")
        self.set_header("Pragma", "no-cache")
        params, authorization = self.body_params(), self.request.headers.get("Authorization")
        if answers_in_memory(self.runtime, self.variant, params, authorization):
            # No I/O at all (cached client, in-process failure counts): sign inline.
            response = token_response(self.runtime, self.variant, params, authorization, self.client_address())
        else:
            response = await self.run(token_response, self.runtime, self.variant, params, authorization,
                                      self.client_address())
        self.write_json(response)


class UserInfoHandler(VariantHandler):
    async def get(self):
        self.set_header("Cache-Control", "no-store")
        token = bearer_value(self.request.headers.get("Authorization"))
        self.write_json(await self.run(userinfo, self.runtime, token))

    async def post(self):
        await self.get()


class IntrospectionHandler(VariantHandler):
    """RFC 7662. Callers: a client authenticated as itself (sees only its own tokens), or the
    host platform with a sandbox user's token, whose successful check is the platform verifying
    the app's token for that user (it records the authorization)."""

    async def post(self):
        self.set_header("Cache-Control", "no-store")
        params = self.body_params()
        token = params.get("token")
        if not isinstance(token, str) or not token:
            raise ApiError(400, "invalid_request", "The token parameter is required.")
        authorization = self.request.headers.get("Authorization") or ""
        self.write_json(await self.run(introspect, self.runtime, params, token, authorization, self.client_address()))


def introspect(runtime, params: dict, token: str, authorization: str, address: str) -> dict:
    """The RFC 7662 answer for this caller (blocking: runs on the runtime's pool). The platform
    (Bearer sandbox token) verifies the token for its user, and learns the ID token issued with it."""
    if authorization.lower().startswith("bearer "):
        return platform_introspection(runtime, authorization[7:].strip(), token)
    claims = active_user_token(runtime, token)
    app = authenticate_client(runtime, params, authorization, address)
    if claims is not None and claims["client_id"] != app.client_id:
        claims = None
    if claims is None:
        claims = active_client_token(runtime, token, app)  # the client's own client-credentials token
    return introspection_response(claims)


class RevocationHandler(VariantHandler):
    """RFC 7009: an authenticated client revokes one of its own tokens; 200 whatever the token was."""

    async def post(self):
        self.set_header("Cache-Control", "no-store")
        params = self.body_params()
        await self.run(revoke, self.runtime, params, self.request.headers.get("Authorization"), self.client_address())
        self.set_status(200)
        self.finish()


def revoke(runtime, params: dict, authorization: str | None, address: str) -> None:
    app = authenticate_client(runtime, params, authorization, address)
    token = text_param(params, "token", max_length=8000)
    revoke_token(runtime, app, token)


def routes(runtime) -> list:
    table = []
    for variant in VARIANTS:
        p = variant.prefix
        table += [
            (rf"{p}/oauth/authorize", AuthorizeHandler, {"variant": variant}),
            (rf"{p}/oauth/token", TokenHandler, {"variant": variant}),
            (rf"{p}/oauth/userinfo", UserInfoHandler, {"variant": variant}),
            (rf"{p}/oauth/introspect", IntrospectionHandler, {"variant": variant}),
            (rf"{p}/oauth/revoke", RevocationHandler, {"variant": variant}),
        ]
    return table
