"""`svc-auth` command line: serve, worker, scheduler and the operator commands.

Every command reads the same configuration as `serve`; a bad argument exits 2 with a message.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys

from conf import ConfigError, Settings

COMMAND_MODULES = ["cli.serve", "cli.directory", "cli.apps", "cli.keys", "cli.db", "cli.sandbox", "cli.demo",
                   "cli.workers", "cli.billing", "cli.developers"]


class UsageError(Exception):
    """A bad argument discovered after parsing (unknown id, duplicate email...): exit 2."""


def emit(result: dict, as_json: bool) -> None:
    """Print a command's result: one JSON object with --json, else `key: value` lines."""
    if as_json:
        print(json.dumps(result, default=str))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")


def build_parser() -> argparse.ArgumentParser:
    import importlib
    parser = argparse.ArgumentParser(prog="svc-auth", description="svc-auth authorization server and partner API")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        print(f"svc-auth: configuration error: {exc}", file=sys.stderr)
        return 2
    from conf.logging import configure_logging
    configure_logging(settings.log_level)
    try:
        return args.handler(settings, args) or 0
    except UsageError as exc:
        print(f"svc-auth {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:  # found once running, e.g. signing keys sealed under another SVC_HMAC_KEY
        print(f"svc-auth: configuration error: {exc}", file=sys.stderr)
        return 2


def with_runtime(command):
    """Run `command(runtime, args)` against the configured database; domain errors exit 2."""
    def handler(settings, args):
        from runtime import Runtime
        from oauth.errors import ApiError
        runtime = Runtime(settings)
        runtime.migrate()
        try:
            return command(runtime, args)
        except ApiError as exc:
            raise UsageError(exc.message) from None
        finally:
            runtime.close()
    return handler
