"""`svc-auth hl7 listen` (the SIU feed's listener, a production process like `worker`) and
`svc-auth hl7 messages`; the feed flags of `orgs create|update` (docs/hl7-feed.md)."""
from __future__ import annotations

from cli.common import UsageError, add_json_flag, emit_list, existing, with_runtime

DEFAULT_PORT = 2575  # IANA's port for HL7 over MLLP
MAX_LIMIT = 10000    # `hl7 messages --limit` (as `audit --limit`)


def register(commands) -> None:
    hl7 = commands.add_parser("hl7", help="the HL7v2 SIU schedule feed (docs/hl7-feed.md)").add_subparsers(
        dest="action", metavar="ACTION", required=True)
    p = hl7.add_parser("listen", help="accept clinics' SIU messages over MLLP (a production process)")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT})")
    p.add_argument("--tls-cert", metavar="FILE", help="PEM certificate chain: MLLP over TLS")
    p.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert")
    p.add_argument("--tls-client-ca", metavar="FILE",
                   help="PEM CA certificate(s): require a client certificate signed by one of them")
    p.add_argument("--proxy-protocol", action="store_true",
                   help="behind a TCP load balancer: every connection comes from SVC_TRUSTED_PROXIES and begins "
                        "with a PROXY header (v1 or v2), whose client address --hl7-allow checks")
    p.set_defaults(handler=with_runtime(_listen))
    p = hl7.add_parser("messages", help="what a clinic's feed sent and how it was acknowledged, newest first")
    p.add_argument("--org", required=True, help="organization id (org_...)")
    p.add_argument("--limit", type=int, default=100, help=f"at most this many (default 100, at most {MAX_LIMIT})")
    add_json_flag(p)
    p.set_defaults(handler=with_runtime(_messages))


def add_feed_flags(p) -> None:
    """`orgs create|update`: the clinic's schedule source and feed."""
    p.add_argument("--schedule-source", choices=("ehr", "siu"),
                   help="where the night reads the schedule: ehr (default: the connector's pull) or siu (the HL7 feed)")
    p.add_argument("--hl7-facility", metavar="NAME",
                   help="the clinic's HL7 sending facility, as its messages' MSH-4 names it ('' clears it)")
    p.add_argument("--hl7-allow", nargs="*", metavar="CIDR",
                   help="addresses the feed may come from (on update, replaces the list; none given: anywhere)")
    p.add_argument("--hl7-client-subject", action="append", metavar="CN",
                   help="the feed is applied only from a client certificate whose subject CN is one of these "
                        "(repeatable or a comma list; on update, replaces the list; '' clears it: any certificate)")


def feed_flags_given(args) -> bool:
    return any(v is not None for v in (args.schedule_source, args.hl7_facility, args.hl7_allow,
                                       args.hl7_client_subject))


def apply_feed_flags(organization_id: str, args):
    from hl7feed.config import configure_feed
    return configure_feed(organization_id, args.schedule_source, args.hl7_facility, args.hl7_allow,
                          subjects=args.hl7_client_subject)


def _listen(runtime, args) -> int:
    from hl7feed.listener import serve_forever, tls_context
    if (args.tls_cert is None) != (args.tls_key is None):
        raise UsageError("give --tls-cert and --tls-key together")
    if args.tls_client_ca and not args.tls_cert:
        raise UsageError("--tls-client-ca needs --tls-cert and --tls-key (client certificates are a TLS feature)")
    if not 0 <= args.port < 65536:
        raise UsageError("--port must be 0-65535 (0: a free port the system chooses, logged at start)")
    if args.proxy_protocol and not runtime.settings.trusted_proxies:
        raise UsageError("--proxy-protocol needs SVC_TRUSTED_PROXIES: the balancers whose PROXY headers are believed")
    try:
        ssl = tls_context(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None
    except (OSError, ValueError) as exc:
        raise UsageError(f"TLS: {exc}") from None
    from ops.startup import StartupError
    try:
        serve_forever(runtime, args.host, args.port, ssl, args.proxy_protocol)
    except UnicodeError:  # a --host no resolver takes (a label over 63 characters): the idna codec refuses it
        raise UsageError(f"--host must be a host name or an IP address, got {args.host[:80]!r}") from None
    except OSError as exc:  # the port is taken, the address is not ours: one line
        raise StartupError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    return 0


def _messages(runtime, args) -> int:
    from hl7feed.store import recent_messages
    from models.directory import Organization
    if not 0 < args.limit <= MAX_LIMIT:
        raise UsageError(f"--limit must be between 1 and {MAX_LIMIT}")
    existing(Organization.get_or_none(Organization.id == args.org), "organization", args.org)
    emit_list(recent_messages(args.org, args.limit), args.json, ["received_at", "control_id", "type", "ack", "error", "note"])
    return 0
