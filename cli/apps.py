"""`svc-auth apps create`, `apps update` (the manifest) and client-secret rotation."""
from __future__ import annotations

from cli import emit, with_runtime
from lifecycle.manifest import update_manifest
from lifecycle.registry import activate_fallback_secret, generate_fallback_secret, register_application, \
    set_redirect_policy, set_require_pkce


def register(commands) -> None:
    apps = commands.add_parser("apps", help="partner applications").add_subparsers(dest="action", required=True)
    p = apps.add_parser("create", help="register an application; prints its client secret once")
    p.add_argument("--name", required=True)
    p.add_argument("--redirect-uri", required=True, action="append",
                   help="the manifest's redirect base URL; repeat it with --redirect-uri-match exact to register "
                        "several exact redirect URIs")
    p.add_argument("--redirect-uri-match", choices=["prefix", "exact"], default="prefix",
                   help="prefix (default): redirect_uri equals the base or lies under it; exact: redirect_uri must "
                        "equal a registered URI after normalisation (OIDC Core 3.1.2.1)")
    p.add_argument("--launch-url", required=True)
    p.add_argument("--token-endpoint")
    p.add_argument("--require-pkce", action="store_true",
                   help="authorization requests must carry an S256 code_challenge (RFC 7636)")
    p.add_argument("--billing-plan", choices=["free_trial", "paid"], default="paid")
    p.add_argument("--user-fields", default="email", help="comma-separated: email,name,ehrUsername,organization")
    p.add_argument("--allowed-origin", action="append", default=[])
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=with_runtime(_create))

    p = apps.add_parser("update", help="change the manifest; only the options given change")
    p.add_argument("--app", required=True, help="application id")
    p.add_argument("--name")
    p.add_argument("--launch-url")
    p.add_argument("--redirect-uri", help="the redirect base URL")
    endpoint = p.add_mutually_exclusive_group()
    endpoint.add_argument("--token-endpoint")
    endpoint.add_argument("--no-token-endpoint", action="store_true",
                          help="remove the token endpoint (the identity-provider variant)")
    origins = p.add_mutually_exclusive_group()
    origins.add_argument("--allowed-origin", action="append", help="replaces the list; repeat for several")
    origins.add_argument("--no-allowed-origins", action="store_true", help="empty the list")
    p.add_argument("--user-fields", help="comma-separated: email,name,ehrUsername,organization ('' for none)")
    pkce = p.add_mutually_exclusive_group()
    pkce.add_argument("--require-pkce", dest="require_pkce", action="store_const", const=True,
                      help="authorize refuses requests without an S256 code_challenge")
    pkce.add_argument("--no-require-pkce", dest="require_pkce", action="store_const", const=False)
    p.add_argument("--redirect-uri-match", choices=["prefix", "exact"],
                   help="prefix: under the base URL; exact: the registered URIs only (the base URL first)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=with_runtime(_update))

    secret = apps.add_parser("secret", help="client secret rotation").add_subparsers(dest="secret_action", required=True)
    p = secret.add_parser("generate-fallback", help="rotation step 1: a new secret, not valid until activated")
    p.add_argument("--app", required=True)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=with_runtime(_generate_fallback))
    p = secret.add_parser("activate-fallback", help="rotation step 3: the fallback becomes the only valid secret")
    p.add_argument("--app", required=True)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=with_runtime(_activate_fallback))


def _create(runtime, args):
    fields = [f.strip() for f in args.user_fields.split(",") if f.strip()]
    app, secret = register_application(runtime, args.name, args.redirect_uri[0], args.launch_url, args.token_endpoint,
                                       args.billing_plan, fields, args.allowed_origin,
                                       redirect_uri_match=args.redirect_uri_match, redirect_uris=args.redirect_uri,
                                       require_pkce=args.require_pkce)
    emit({"application_id": app.id, "client_id": app.client_id, "client_secret": secret, "name": app.name,
          "redirect_uri": app.redirect_uri, "launch_url": app.launch_url, "token_endpoint": app.token_endpoint,
          "billing_plan": app.billing_plan, "user_fields": app.user_fields,
          "allowed_origins": app.allowed_origins, "redirect_uri_match": app.redirect_uri_match,
          "redirect_uris": app.redirect_uris, "require_pkce": app.require_pkce}, args.json)


def _update(runtime, args):
    changes = {key: value for key, value in (("name", args.name), ("launch_url", args.launch_url),
                                             ("redirect_uri", args.redirect_uri),
                                             ("token_endpoint", args.token_endpoint)) if value is not None}
    if args.no_token_endpoint:
        changes["token_endpoint"] = None
    if args.allowed_origin is not None or args.no_allowed_origins:
        changes["allowed_origins"] = args.allowed_origin or []
    if args.user_fields is not None:
        changes["user_fields"] = [f.strip() for f in args.user_fields.split(",") if f.strip()]
    app = update_manifest(runtime, args.app, "operator", **changes)
    if args.require_pkce is not None:
        app = set_require_pkce(runtime, app.id, args.require_pkce)
    if args.redirect_uri_match is not None:
        app = set_redirect_policy(runtime, app.id, args.redirect_uri_match, app.redirect_uris)
    emit({"application_id": app.id, "client_id": app.client_id, "name": app.name, "redirect_uri": app.redirect_uri,
          "launch_url": app.launch_url, "token_endpoint": app.token_endpoint, "billing_plan": app.billing_plan,
          "user_fields": app.user_fields, "allowed_origins": app.allowed_origins,
          "redirect_uri_match": app.redirect_uri_match, "redirect_uris": app.redirect_uris,
          "require_pkce": app.require_pkce}, args.json)


def _generate_fallback(runtime, args):
    secret = generate_fallback_secret(runtime, args.app)
    if args.json:
        emit({"application_id": args.app, "fallback_secret": secret}, True)
    else:
        print(secret)


def _activate_fallback(runtime, args):
    activate_fallback_secret(runtime, args.app)
    emit({"application_id": args.app, "activated": True}, args.json)
