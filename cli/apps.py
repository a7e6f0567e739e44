"""`svc-auth apps create|list|show|delete`, `apps update` (the manifest) and client-secret rotation."""
from __future__ import annotations

import argparse

from cli.common import UsageError, add_json_flag, emit, emit_list, existing, with_runtime
from fhir_api.limits import parse_rate
from lifecycle.backend_apps import set_backend_keys, set_system_scopes
from lifecycle.manifest import update_manifest
from lifecycle.applications import (delete_application, register_application, set_fhir_rate_limits,
                                    set_offline_access_ttl, set_public, set_redirect_policy, set_require_pkce,
                                    set_smart_scopes, whole_seconds)
from oauth.secret_rotation import activate_fallback_secret, generate_fallback_secret
from models.application import Application, Installation
from models.clock import utc_iso


def register(commands) -> None:
    apps = commands.add_parser("apps", help="partner applications").add_subparsers(
        dest="action", metavar="ACTION", required=True)
    p = apps.add_parser("create", help="register an application; prints its client secret once")
    p.add_argument("--name", required=True, help="the app's name, as clinicians see it in the hub")
    p.add_argument("--redirect-uri", required=True, action="append",
                   help="the manifest's redirect base URL; repeat it with --redirect-uri-match exact to register "
                        "several exact redirect URIs")
    p.add_argument("--redirect-uri-match", choices=["prefix", "exact"], default="prefix",
                   help="prefix (default): redirect_uri equals the base or lies under it; exact: redirect_uri must "
                        "equal a registered URI after normalisation (OIDC Core 3.1.2.1)")
    p.add_argument("--launch-url", required=True, help="the app's launch endpoint; the hub loads it with launch_id")
    p.add_argument("--token-endpoint", help="the app's own token endpoint (the example app's /api/token)")
    p.add_argument("--require-pkce", action="store_true",
                   help="authorization requests must carry an S256 code_challenge (RFC 7636)")
    p.add_argument("--public", action="store_true",
                   help="a public client (token_endpoint_auth_method none, e.g. a browser-only SMART app): no "
                        "client secret; PKCE S256 required; no client_credentials grant or partner API")
    p.add_argument("--smart-scopes", metavar="SCOPES",
                   help="the SMART scopes the app declares, space-separated (default: launch launch/patient "
                        "openid fhirUser profile patient/*.rs user/*.rs); authorize grants at most these")
    p.add_argument("--billing-plan", choices=["free_trial", "paid"], default="paid",
                   help="free_trial: 30 days from the first Enabled, then billed; paid: billed from the start")
    p.add_argument("--user-fields", default="email", help="comma-separated: email,name,ehrUsername,organization")
    p.add_argument("--allowed-origin", action="extend", nargs="+", default=[], metavar="ORIGIN",
                   help="origins (https://app.example) whose browser code may call the token, userinfo, "
                        "introspect and revoke endpoints with this app's client_id (CORS); several after one "
                        "flag, or the flag repeated")
    _add_backend_flags(p)
    add_json_flag(p)
    p.set_defaults(handler=with_runtime(_create))

    p = apps.add_parser("update", help="change the manifest; only the options given change")
    p.add_argument("--app", required=True, help="application id")
    p.add_argument("--name", help="new name")
    p.add_argument("--launch-url", help="new launch URL")
    p.add_argument("--redirect-uri", help="the redirect base URL")
    endpoint = p.add_mutually_exclusive_group()
    endpoint.add_argument("--token-endpoint", help="new token endpoint URL")
    endpoint.add_argument("--no-token-endpoint", action="store_true",
                          help="remove the token endpoint (the identity-provider variant)")
    origins = p.add_mutually_exclusive_group()
    origins.add_argument("--allowed-origin", action="extend", nargs="+", metavar="ORIGIN",
                         help="replaces the list; several after one flag, or the flag repeated")
    origins.add_argument("--no-allowed-origins", action="store_true", help="empty the list")
    p.add_argument("--user-fields", help="comma-separated: email,name,ehrUsername,organization ('' for none)")
    pkce = p.add_mutually_exclusive_group()
    pkce.add_argument("--require-pkce", dest="require_pkce", action="store_const", const=True,
                      help="authorize refuses requests without an S256 code_challenge")
    pkce.add_argument("--no-require-pkce", dest="require_pkce", action="store_const", const=False,
                      help="PKCE optional again")
    p.add_argument("--redirect-uri-match", choices=["prefix", "exact"],
                   help="prefix: under the base URL; exact: the registered URIs only (the base URL first)")
    client_type = p.add_mutually_exclusive_group()
    client_type.add_argument("--public", dest="public", action="store_const", const=True,
                             help="make it a public client: its secrets stop working at once; PKCE S256 required")
    client_type.add_argument("--no-public", dest="public", action="store_const", const=False,
                             help="make it a confidential client again: prints a new client_secret once")
    p.add_argument("--smart-scopes", metavar="SCOPES", help="the SMART scopes the app declares, space-separated "
                                                            "(offline_access / online_access: refresh tokens)")
    p.add_argument("--offline-access-ttl", type=_offline_ttl, metavar="SECONDS",
                   help="how long the app's offline_access grants live (3600 to 5 years); 'default' for "
                        "SVC_OFFLINE_ACCESS_TTL (90 days)")
    p.add_argument("--fhir-rate-limit", type=_rate, metavar="N/UNIT",
                   help="FHIR API requests this app may make per clinic, e.g. 1200/minute (UNIT: second, minute, "
                        "hour, day, or a number of seconds); 'default' for SVC_FHIR_RATE_LIMIT (600/60)")
    p.add_argument("--fhir-token-rate-limit", type=_rate, metavar="N/UNIT",
                   help="FHIR API requests per access token of this app, e.g. 300/minute; 'default' for "
                        "SVC_FHIR_TOKEN_RATE_LIMIT (200/60)")
    _add_backend_flags(p, update=True)
    add_json_flag(p)
    p.set_defaults(handler=with_runtime(_update))

    p = apps.add_parser("list", help="list every application")
    add_json_flag(p)
    p.set_defaults(handler=with_runtime(_list))
    p = apps.add_parser("show", help="show one application's manifest (never its secrets)")
    p.add_argument("--app", required=True, help="application id (app_...)")
    add_json_flag(p)
    p.set_defaults(handler=with_runtime(_show))
    p = apps.add_parser("delete", help="delete an application with its installations and tokens")
    p.add_argument("--app", required=True, help="application id (app_...)")
    p.add_argument("--yes", action="store_true", help="confirm: the deletion cannot be undone")
    add_json_flag(p)
    p.set_defaults(handler=with_runtime(_delete))

    secret = apps.add_parser("secret", help="client secret rotation").add_subparsers(
        dest="secret_action", metavar="ACTION", required=True)
    p = secret.add_parser("generate-fallback", help="rotation step 1: a new secret, not valid until activated")
    p.add_argument("--app", required=True, help="application id")
    add_json_flag(p)
    p.set_defaults(handler=with_runtime(_generate_fallback))
    p = secret.add_parser("activate-fallback", help="rotation step 3: the fallback becomes the only valid secret")
    p.add_argument("--app", required=True, help="application id")
    add_json_flag(p)
    p.set_defaults(handler=with_runtime(_activate_fallback))


_DEFAULT = "default"


def _add_backend_flags(p, update: bool = False) -> None:
    """SMART Backend Services (docs/bulk-data.md): the app's public keys and its system scopes."""
    keys = p.add_mutually_exclusive_group()
    keys.add_argument("--jwks-url", metavar="URL",
                      help="where the backend's public keys (a JWKS) are published: https, or http on a loopback "
                           "address; svc-auth fetches and caches it")
    keys.add_argument("--jwks-file", metavar="FILE", type=argparse.FileType("rb"),
                      help="a file with the backend's public JWKS (RS384: RSA >= 2048 bits, ES384: EC P-384), stored")
    if update:
        keys.add_argument("--no-jwks", action="store_true", help="remove the registered keys (URL or stored JWKS)")
    p.add_argument("--system-scopes", metavar="SCOPES",
                   help="the system scopes the backend may ask, space-separated, read-only: e.g. "
                        "\"system/Patient.rs system/Observation.rs\" or \"system/*.rs\"" + (" ('' for none)" if update else ""))


def _read_jwks_file(handle) -> str:
    with handle:
        data = handle.read(200 * 1024 + 1)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError("--jwks-file: not UTF-8 JSON") from None


def _apply_backend_flags(runtime, app, args):
    """`--jwks-url`/`--jwks-file`/`--no-jwks` and `--system-scopes`, when given."""
    if args.jwks_url is not None:
        app = set_backend_keys(runtime, app.id, jwks_url=args.jwks_url)
    elif args.jwks_file is not None:
        app = set_backend_keys(runtime, app.id, jwks_text=_read_jwks_file(args.jwks_file))
    elif getattr(args, "no_jwks", False):
        app = set_backend_keys(runtime, app.id)
    if args.system_scopes is not None:
        app = set_system_scopes(runtime, app.id, args.system_scopes)
    return app


def _rate(text: str):
    """An argparse type: a FHIR rate (`Limit`), or `default`; anything else exits 2 with the reason."""
    if text.strip().lower() == _DEFAULT:
        return _DEFAULT
    try:
        return parse_rate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _offline_ttl(text: str):
    """An argparse type: whole seconds, or `default`."""
    if text.strip().lower() == _DEFAULT:
        return _DEFAULT
    seconds = whole_seconds(text)
    if seconds is None:
        raise argparse.ArgumentTypeError("a whole number of seconds, or 'default'")
    return seconds


def _user_fields(text: str) -> list[str]:
    return [f.strip() for f in text.split(",") if f.strip()]


def _create(runtime, args):
    jwks_text = _read_jwks_file(args.jwks_file) if args.jwks_file is not None else None
    if args.jwks_url is not None or jwks_text is not None or args.system_scopes is not None:
        _check_backend_flags(args, jwks_text)  # before anything is created: a bad value creates nothing
    app, secret = register_application(runtime, args.name, args.redirect_uri[0], args.launch_url, args.token_endpoint,
                                       args.billing_plan, _user_fields(args.user_fields), args.allowed_origin,
                                       redirect_uri_match=args.redirect_uri_match, redirect_uris=args.redirect_uri,
                                       require_pkce=args.require_pkce, public=args.public,
                                       smart_scopes=args.smart_scopes)
    if args.jwks_url is not None or jwks_text is not None:
        app = set_backend_keys(runtime, app.id, jwks_url=args.jwks_url, jwks_text=jwks_text)
    if args.system_scopes is not None:
        app = set_system_scopes(runtime, app.id, args.system_scopes)
    # The secret right after the ids: printed once, here only. A public client has none.
    shown = {"client_secret": secret} if secret else {}
    emit({"application_id": app.id, "client_id": app.client_id, **shown, **manifest_dict(app)}, args.json)


def _update(runtime, args):
    """Every option given, or none: one transaction, so an option refused after others were applied
    (a bad `--smart-scopes` after `--name`) leaves the app as it was."""
    with runtime.db.atomic():
        app, secret = _apply_update(runtime, args)
    emit({**manifest_dict(app), **({"client_secret": secret} if secret else {})}, args.json)


def _apply_update(runtime, args):
    changes = {key: value for key, value in (("name", args.name), ("launch_url", args.launch_url),
                                             ("redirect_uri", args.redirect_uri),
                                             ("token_endpoint", args.token_endpoint)) if value is not None}
    if args.no_token_endpoint:
        changes["token_endpoint"] = None
    if args.allowed_origin is not None or args.no_allowed_origins:
        changes["allowed_origins"] = args.allowed_origin or []
    if args.user_fields is not None:
        changes["user_fields"] = _user_fields(args.user_fields)
    app = update_manifest(runtime, args.app, "operator", **changes)
    if args.require_pkce is not None:
        app = set_require_pkce(runtime, app.id, args.require_pkce)
    if args.redirect_uri_match is not None:
        app = set_redirect_policy(runtime, app.id, args.redirect_uri_match, app.redirect_uris)
    if args.smart_scopes is not None:
        app = set_smart_scopes(runtime, app.id, args.smart_scopes)
    limits = {name: None if value == _DEFAULT else value
              for name, value in (("fhir_rate_limit", args.fhir_rate_limit),
                                  ("fhir_token_rate_limit", args.fhir_token_rate_limit)) if value is not None}
    if limits:
        app = set_fhir_rate_limits(runtime, app.id, **limits)
    if args.offline_access_ttl is not None:
        app = set_offline_access_ttl(runtime, app.id, None if args.offline_access_ttl == _DEFAULT
                                     else args.offline_access_ttl)
    app = _apply_backend_flags(runtime, app, args)
    secret = None
    if args.public is not None:
        app, secret = set_public(runtime, app.id, args.public)
    return app, secret


def _check_backend_flags(args, jwks_text: str | None) -> None:
    from lifecycle.backend_apps import jwks_url_problem
    from oauth.client_keys import JwksError, parse_jwks
    from oauth.system_scopes import validate_registered
    if args.jwks_url is not None and (problem := jwks_url_problem(args.jwks_url)):
        raise UsageError(f"--jwks-url: {problem}")
    if jwks_text is not None:
        try:
            parse_jwks(jwks_text, strict=True)
        except JwksError as exc:
            raise UsageError(f"--jwks-file: {exc}") from None
    if args.system_scopes is not None:
        try:
            validate_registered(args.system_scopes)
        except ValueError as exc:
            raise UsageError(f"--system-scopes: {exc}") from None


def manifest_dict(app: Application) -> dict:
    """An application's manifest, as `apps create` and `apps update` print it."""
    return {"application_id": app.id, "client_id": app.client_id, "name": app.name,
            "redirect_uri": app.redirect_uri, "launch_url": app.launch_url, "token_endpoint": app.token_endpoint,
            "billing_plan": app.billing_plan, "user_fields": app.user_fields, "allowed_origins": app.allowed_origins,
            "redirect_uri_match": app.redirect_uri_match, "redirect_uris": app.redirect_uris,
            "require_pkce": app.require_pkce, "public": app.public,
            "token_endpoint_auth_method": "none" if app.public else "client_secret_basic",
            "smart_scopes": app.smart_scopes,
            # COUNT/SECONDS, or "default" (SVC_FHIR_RATE_LIMIT, SVC_FHIR_TOKEN_RATE_LIMIT apply)
            "fhir_rate_limit": app.fhir_rate_limit or _DEFAULT,
            "fhir_token_rate_limit": app.fhir_token_rate_limit or _DEFAULT,
            # seconds an offline_access grant lives, or "default" (SVC_OFFLINE_ACCESS_TTL)
            "offline_access_ttl": app.offline_access_ttl or _DEFAULT,
            # SMART Backend Services: where its public keys are, whether a JWKS is stored, what it may ask
            "jwks_url": app.jwks_url, "jwks_stored": bool(app.jwks), "system_scopes": app.system_scopes or ""}


def app_dict(app: Application) -> dict:
    """An application's manifest as the operator sees it; secrets are never shown again."""
    return {**manifest_dict(app), "fallback_secret_pending": bool(app.fallback_secret_hash),
            "created_at": utc_iso(app.created_at)}


def _find(application_id: str) -> Application:
    return existing(Application.by_id(application_id), "application", application_id)


def _list(runtime, args):
    rows = [app_dict(a) for a in Application.select().order_by(Application.created_at, Application.id)]
    emit_list(rows, args.json, ["application_id", "client_id", "name", "billing_plan", "redirect_uri"])


def _show(runtime, args):
    result = app_dict(_find(args.app))
    result["installations"] = [
        {"organization_id": i.organization_id, "activation_status": i.activation_status}
        for i in Installation.select().where(Installation.application == args.app).order_by(Installation.id)]
    emit(result, args.json)


def _delete(runtime, args):
    app = _find(args.app)
    if not args.yes:
        raise UsageError(f"this deletes {app.name!r} ({app.id}), its installations and tokens; "
                         f"run again with --yes to confirm")
    delete_application(runtime, app.id)
    emit({"application_id": app.id, "deleted": True}, args.json)


def _generate_fallback(runtime, args):
    secret = generate_fallback_secret(runtime, args.app)
    if args.json:
        emit({"application_id": args.app, "fallback_secret": secret}, True)
    else:
        print(secret)


def _activate_fallback(runtime, args):
    activate_fallback_secret(runtime, args.app)
    emit({"application_id": args.app, "activated": True}, args.json)
