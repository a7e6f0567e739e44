"""`svc-auth demo seed [--reset] [--json]`, and what `serve --demo` starts (`start_demo`)."""
from __future__ import annotations

import logging

from cli.common import emit, with_runtime
from cli.demo_seed import (DEMO_DEVELOPER_EMAIL, DEMO_SMART_APP_NAME, demo_app_url, demo_patient, demo_signin_links,
                           example_app_config, seed_demo, smart_app_config, smart_app_urls)

log = logging.getLogger("svc_auth.demo")


def register(commands) -> None:
    demo = commands.add_parser("demo", help="demo data").add_subparsers(dest="action", required=True)
    p = demo.add_parser("seed", help="create the demo clinic, users and example app (idempotent)")
    p.add_argument("--app-url", help="base URL of the example partner app (default: where it is registered, "
                                     "else http://127.0.0.1:8889)")
    p.add_argument("--reset", action="store_true",
                   help="first delete the demo clinic, users and app: back to the first-launch state")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=with_runtime(lambda runtime, args: emit(seed_demo(runtime, args.app_url, reset=args.reset), args.json)))


def start_demo(runtime, app_port: int, sockets) -> None:
    """`serve --demo`: seed, start the example partner app (and the example SMART app under
    /smart/ on the same port) on this IOLoop, print where to look.
    `sockets`: already bound to `app_port` (`serve` binds them first, so a taken port stops the
    start with one line). Under --processes N, `serve` calls it in the first worker only: one seed,
    one banner, and the example apps (whose sessions live in memory) in one process.
    `cli.demo_seed` seeds; this module serves."""
    import tornado.httpserver
    from tornado.routing import AnyMatches, PathMatches, RuleRouter
    from examples.partner_app.web import make_partner_app
    from examples.smart_app.web import PREFIX, make_smart_app
    info = seed_demo(runtime, demo_app_url(app_port))
    patient = demo_patient()
    router = RuleRouter([(PathMatches(PREFIX + ".*"), make_smart_app(smart_app_config(runtime, app_port))),
                         (AnyMatches(), make_partner_app(example_app_config(runtime, info, app_port)))])
    server = tornado.httpserver.HTTPServer(router)
    server.add_sockets(sockets)
    log.info("demo data ready; sign in to the hub with the one-time links printed below")
    links = demo_signin_links(runtime, info)
    # A second terminal has neither the sandbox nor the issuer `serve --demo` set for itself.
    more = f"SVC_SANDBOX=on SVC_ISSUER={runtime.settings.issuer} svc-auth sandbox signin-link --user ID"
    print(f"\nsvc-auth demo (one-time sign-in links; `{more}` makes more)\n"
          f"  service (discovery): {runtime.settings.issuer}/.well-known/openid-configuration\n"
          f"  hub (physician): {info['hub_url']}\n"
          f"  example app opened at once (physician): {links['physician_app']}\n"
          f"  hub (staff, refused by the app): {links['staff_hub']}\n"
          f"  settings (sandbox token): {links['physician_settings']}\n"
          f"  example partner app: {demo_app_url(app_port)}/app (launch URL {demo_app_url(app_port)}/launch; open it from the hub)\n"
          f"  SMART example app (physician; click \"Open {DEMO_SMART_APP_NAME}\" on a patient's row): "
          f"{links['physician_smart']} (launch URL {smart_app_urls(demo_app_url(app_port))['launch_url']})\n"
          f"  developer console ({DEMO_DEVELOPER_EMAIL}, one-time invitation): {links['console_invite']}\n"
          f"  client_id: {info['client_id']}\n  client_secret: {info['client_secret']}\n"
          f"  demo patient (chart requests): {patient.id} ({patient.first_name} {patient.last_name})\n"
          f"  appointments: open the app in the physician's hub, then run `svc-auth snapshot run`\n", flush=True)
