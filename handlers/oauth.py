"""The authorization server endpoints, served under each address variant (`/v1`, `/os-api/v2`)."""
from __future__ import annotations

import html

from handlers.base import NO_RESOURCES_CSP, BaseHandler
from handlers.cors import CorsHandler
from oauth.authorization_code import AuthorizationRequest
from oauth.clients import claimed_client_id
from errors import ApiError
from oauth.errors import AuthorizeError
from oauth.introspection import introspect
from oauth.resource import USERINFO, userinfo
from oauth.revocation import revoke
from oauth.token_endpoint import in_memory_client, token_response
from oauth.variants import VARIANTS
from hub.introspection import platform_introspection


class VariantHandler(BaseHandler):
    def initialize(self, variant):
        self.variant = variant


class AuthorizeHandler(VariantHandler):
    """GET and POST (OIDC Core 3.1.2.1; SMART's `authorize-post`): one request, the same checks.
    No cookie is read: the launch (`launch_id`, `launch`, `login_hint`) is what names the user, so a
    cross-site POST (which carries no SameSite=Lax cookie) is the same request as a GET."""

    async def get(self):
        await self.authorize(self.query_params(), 302)

    async def post(self):
        """The form body's parameters, with the query's (a name in both is refused, never
        last-wins); 303 so the browser GETs redirect_uri (RFC 9700 4.12), never re-posts to it."""
        await self.authorize(self.query_and_form_params(), 303)

    async def authorize(self, params: dict, redirect_status: int):
        request = AuthorizationRequest(self.runtime)
        try:
            location = await self.run(request.issue_code, params)
        except AuthorizeError as err:
            if err.redirect_uri:
                location = request.error_location(err)
            else:
                return self.render_untrusted_error(err)
        self.no_store()
        self.redirect(location, status=redirect_status)

    def render_untrusted_error(self, err: AuthorizeError):
        self.set_status(400)
        self.no_store()
        if "application/json" in (self.request.headers.get("Accept") or ""):
            return self.write_json({"error": err.error, "error_description": err.description,
                                    "message": err.description}, 400)
        self.html_headers(NO_RESOURCES_CSP)
        self.finish(f"<!doctype html><title>Authorization error</title><h1>Authorization error</h1>"
                    f"<p><code>{html.escape(err.error)}</code>: {html.escape(err.description)}</p>")


class TokenHandler(CorsHandler, VariantHandler):
    async def post(self):
        self.no_store()
        self.set_header("Pragma", "no-cache")
        params, authorization = self.body_params(), self.request.headers.get("Authorization")
        if "Origin" in self.request.headers:  # a browser's request (CORS); servers send none
            await self.allow_origin_of(claimed_client_id(params, authorization))
        client = in_memory_client(self.runtime, self.variant, params, authorization)
        if client is not None:  # no I/O at all (a cached client, its right secret): sign inline
            response = token_response(self.runtime, self.variant, params, authorization, client=client)
        else:
            response = await self.run(token_response, self.runtime, self.variant, params, authorization,
                                      self.client_address())
        self.write_json(response)


class UserInfoHandler(CorsHandler, VariantHandler):
    async def get(self):
        self.no_store()
        caller = await self.run(USERINFO.caller, self.runtime, self.request.headers.get("Authorization"))
        if self.request.headers.get("Origin"):
            await self.allow_origin_of(caller.app.client_id)
        self.write_json(userinfo(self.runtime, caller))

    async def post(self):
        await self.get()


class IntrospectionHandler(CorsHandler, VariantHandler):
    """RFC 7662. Callers: a client authenticated as itself (sees only its own tokens), or the
    host platform with a sandbox user's token, whose successful check is the platform verifying
    the app's token for that user (it records the authorization)."""

    async def post(self):
        self.no_store()
        params = self.body_params()
        authorization = self.request.headers.get("Authorization") or ""
        if not authorization.lower().startswith("bearer "):
            await self.allow_origin_of(claimed_client_id(params, authorization))
        token = params.get("token")
        if not isinstance(token, str) or not token:
            raise ApiError(400, "invalid_request", "The token parameter is required.")
        self.write_json(await self.run(introspect, self.runtime, params, token, authorization,
                                             self.client_address(), platform_introspection))


class RevocationHandler(CorsHandler, VariantHandler):
    """RFC 7009: an authenticated client revokes one of its own tokens; 200 whatever the token was."""

    async def post(self):
        self.no_store()
        params, authorization = self.body_params(), self.request.headers.get("Authorization")
        await self.allow_origin_of(claimed_client_id(params, authorization))
        await self.run(revoke, self.runtime, params, authorization, self.client_address())
        self.set_status(200)
        self.finish()


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
