"""`svc-auth serve`: the HTTP server (`--demo` also seeds demo data and starts the example app)."""
from __future__ import annotations

MAX_PROCESSES = 256  # `--processes`


def register(commands) -> None:
    p = commands.add_parser("serve", help="run the HTTP server")
    p.add_argument("--port", type=int, default=8888, help="TCP port to listen on (default 8888)")
    p.add_argument("--address", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--processes", type=int, default=1, help="fork N processes, sharing the port, new connections to the one with the fewest (0 = one per core; at most 256)")
    p.add_argument("--restart-budget", type=int, default=30, metavar="N",
                   help="with --processes: at most N worker restarts per minute; more wait (default 30)")
    p.add_argument("--restart-backoff-max", type=float, default=10.0, metavar="SECONDS",
                   help="with --processes: longest wait before restarting a crashed worker (default 10)")
    p.add_argument("--heartbeat-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="with --processes: replace a worker silent this long (default 30)")
    p.add_argument("--drain-timeout", type=float, default=25.0, metavar="SECONDS",
                   help="after SIGTERM, requests in flight get this long (default 25); "
                        "with --processes, workers still running 5 s later get SIGKILL")
    p.add_argument("--demo", action="store_true", help="seed demo data and start the example partner app")
    p.add_argument("--demo-app-port", type=int, default=8889, help="port of the example partner app (with --demo)")
    p.set_defaults(handler=run)


def run(settings, args) -> int:
    from cli.common import UsageError
    from server import serve
    if not 0 <= args.processes <= MAX_PROCESSES:  # 2**64 would fork until the machine gave out
        raise UsageError(f"--processes must be 0 (one per core) to {MAX_PROCESSES}")
    if not 0 < args.port < 65536:
        raise UsageError("--port must be between 1 and 65535")
    from ops.processes import SupervisorPolicy
    if args.restart_budget < 1:
        raise UsageError("--restart-budget must be 1 or more")
    for option in ("restart_backoff_max", "heartbeat_timeout", "drain_timeout"):
        value = getattr(args, option)
        if not (0 < value < 86400):  # also refuses nan and inf
            raise UsageError(f"--{option.replace('_', '-')} must be a number of seconds above 0 and below 86400")
    policy = SupervisorPolicy(restart_budget=args.restart_budget, backoff_max=args.restart_backoff_max,
                              heartbeat_timeout=args.heartbeat_timeout, drain_timeout=args.drain_timeout)
    on_start = None
    if args.demo:
        import functools
        from cli.demo import start_demo
        from cli.demo_seed import demo_settings
        if not 0 < args.demo_app_port < 65536 or args.demo_app_port == args.port:
            raise UsageError("--demo-app-port must be between 1 and 65535 and differ from --port")
        settings = demo_settings(settings, args.port)
        import tornado.netutil
        from ops.startup import bind_error
        try:  # before anything starts: a taken APP_PORT is one line, like a taken --port
            demo_sockets = tornado.netutil.bind_sockets(args.demo_app_port, address="127.0.0.1")
        except OSError as exc:
            raise bind_error(exc, args.demo_app_port, "127.0.0.1", option="APP_PORT (--demo-app-port)") from None
        on_start = functools.partial(start_demo, app_port=args.demo_app_port, sockets=demo_sockets)
        settings = settings.replace(sandbox=True)  # the demo is the sandbox EHR
    serve(settings, args.port, args.processes, args.address, on_start=on_start, policy=policy)
    return 0
