"""`svc-auth` command line: serve, worker, scheduler and the operator commands.

Every command reads the same configuration as `serve`; a bad argument exits 2 with a message.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

from cli import apps, audit, billing, db, demo, developers, directory, ehr, grants, hl7, keys, sandbox, serve, workers
from cli.common import UsageError
from conf import ConfigError, Settings

# The subcommands, in `svc-auth --help` order; each module's `register(commands)` adds its own.
COMMAND_MODULES = (serve, directory, ehr, apps, grants, keys, db, sandbox, demo, workers, hl7, billing, audit, developers)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="svc-auth", description="svc-auth authorization server and partner API")
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}",
                        help="print the installed version and exit")
    parser.add_argument("--env-file", metavar="PATH",
                        help="read settings from this file (KEY=VALUE lines, # comments: the format of systemd's "
                             "EnvironmentFile) instead of ./.env; its variables (AWS_* too) are exported to the "
                             "process, and the environment wins")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMAND_MODULES:
        module.register(commands)
    return parser


def package_version() -> str:
    """The installed distribution's version (setup.py), or "unknown" when run from a bare checkout."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("svc-auth")
    except PackageNotFoundError:
        return "unknown"


def _export_env_file(path: str) -> None:
    """Put the file's variables into os.environ (where boto3 and children read them too)."""
    import os
    from pathlib import Path
    from conf import read_env_file
    if not Path(path).is_file():
        raise ConfigError(f"--env-file {path}: no such file")
    values = read_env_file(Path(path), f"--env-file {path}")
    for key, value in values.items():
        if "\0" in key or "\0" in value or not key or "=" in key:  # os.environ refuses them: ValueError
            raise ConfigError(f"--env-file {path}: {key[:40]!r} is not a variable the environment can hold")
        os.environ.setdefault(key, value)


FILE_OPTIONS = frozenset({"env_file", "tls_cert", "tls_key", "tls_client_ca"})
"""Options naming a file: opened with the bytes the system gave, whatever their encoding."""


def not_utf8(args: argparse.Namespace) -> str | None:
    """The first option (`--given-name`) whose value is not UTF-8 text, or None. Python gives such
    bytes as lone surrogates, which the database (and every encoder) refuses with a traceback."""
    for dest, value in vars(args).items():
        if dest in FILE_OPTIONS:
            continue
        for one in value if isinstance(value, list) else (value,):
            if isinstance(one, str) and not one.isascii():
                try:
                    one.encode("utf-8")
                except UnicodeEncodeError:
                    return "--" + dest.replace("_", "-")
    return None


def _reader_gone() -> int:
    """Standard output's reader closed the pipe (`svc-auth ... | head`): end with status 1 and no
    traceback, standard output pointed at /dev/null so the exit's flush cannot fail again (the
    signal module's "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 1


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    bad = not_utf8(args)
    if bad:
        print(f"svc-auth {args.command}: error: {bad} is not UTF-8 text (a terminal or script in another encoding "
              "sent it); give it in UTF-8", file=sys.stderr)
        return 2
    try:
        dotenv = ".env"
        if args.env_file:
            dotenv = None
            _export_env_file(args.env_file)
        settings = Settings.from_env(dotenv=dotenv)
    except ConfigError as exc:
        print(f"svc-auth: configuration error: {exc}", file=sys.stderr)
        return 2
    from conf.logging import configure_logging
    configure_logging(settings.log_level)
    if settings.clock_offset:
        logging.getLogger("svc_auth.config").warning(
            "SVC_CLOCK_OFFSET is %s seconds: this process's clock is moved (a test-only setting; unset it in "
            "a deployment)", settings.clock_offset, extra={"clock_offset": settings.clock_offset})
    from ops.startup import StartupError, database_error, is_database_error
    try:
        status = args.handler(settings, args) or 0
        sys.stdout.flush()  # a reader gone (`| head`) is met here, not in the interpreter's exit
        return status
    except BrokenPipeError:
        return _reader_gone()
    except UsageError as exc:
        print(f"svc-auth {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:  # found once running, e.g. signing keys sealed under another SVC_HMAC_KEY
        print(f"svc-auth: configuration error: {exc}", file=sys.stderr)
        return 2
    except StartupError as exc:
        print(f"svc-auth {args.command}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001  (a database that went away: one line, not a traceback)
        if not is_database_error(exc):
            raise
        print(f"svc-auth {args.command}: {database_error(exc, settings)}", file=sys.stderr)
        return 1
