"""What every subcommand shares: usage errors, output (`emit`, `emit_list`, `--json`), and running
a command against the configured runtime (`with_runtime`)."""
from __future__ import annotations

import json

# What a terminal would act on rather than show: C0 and C1 controls, DEL, and Unicode's line
# separators and bidirectional overrides. A table or `key: value` line shows each as an escape, so a
# value stored from outside (an HL7 sender's control id) can neither move the cursor nor forge a row.
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))} | {
    c: f"\\u{c:04x}" for c in (0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A))}


def printable(value) -> str:
    """`value` as text for a terminal, every control character escaped (`\\x1b`)."""
    return "" if value is None else str(value).translate(_CONTROLS)


class UsageError(Exception):
    """A bad argument discovered after parsing (unknown id, duplicate email...): exit 2."""


def emit(result: dict, as_json: bool) -> None:
    """Print a command's result: one JSON object with --json, else `key: value` lines."""
    if as_json:
        print(json.dumps(result, default=str))
    else:
        for key, value in result.items():
            print(f"{key}: {printable(value)}")


def emit_list(rows: list[dict], as_json: bool, columns: list[str]) -> None:
    """Print a list: one JSON array with --json, else an aligned table of `columns`."""
    if as_json:
        print(json.dumps(rows, default=str))
        return
    cells = [[printable(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    for line in [columns, *cells]:
        print("  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip())


def existing(row, kind: str, row_id: str):
    """`row` when the lookup found it, else the usage error `no <kind> has id '<row_id>'`."""
    if row is None:
        raise UsageError(f"no {kind} has id {row_id!r}")
    return row


def add_json_flag(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON (one object, or one array for lists)")


def with_runtime(command, check_redis: bool = False):
    """Run `command(runtime, args)` against the configured database; domain errors exit 2.
    `check_redis`: the command needs SVC_REDIS_URL to answer (worker, scheduler)."""
    def handler(settings, args):
        from errors import ApiError
        from runtime.startup import open_runtime
        runtime = open_runtime(settings, check_redis=check_redis)
        try:
            return command(runtime, args)
        except ApiError as exc:
            raise UsageError(exc.message) from None
        finally:
            runtime.close()
    return handler

