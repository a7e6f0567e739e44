"""Logging configuration: one JSON object per line, a request id on every line, no secrets.

Every process (`serve`, `worker`, `scheduler`, operator commands) calls `configure_logging` once.
Each line carries `ts`, `level`, `logger`, `message`, `request_id` (the HTTP request being served,
or `null` outside one) and any `extra={...}` fields. The formatter redacts, as a last line of
defence, the values of sensitive query parameters (`code`, `launch_id` and SMART's `launch`, `client_secret`...),
bearer/basic credentials, the secret of a one-time link's path (`SECRET_PATHS`), anything shaped
like a JWT, and the values of a FHIR URL's query (a search names the patient it looks for; paging
controls kept: `FHIR_QUERY_KEPT`), wherever they appear in a line.
"""
from __future__ import annotations

import contextvars
import datetime as dt
import json
import logging
import math
import re
import sys
import time
from urllib.parse import urlsplit, urlunsplit

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("svc_request_id", default=None)
"""The id of the HTTP request this code runs for; set by the HTTP layer (`ops.observability`)."""

REDACTED = "[REDACTED]"

SENSITIVE_PARAMS = (
    "code", "launch_id", "launch", "login_hint", "client_secret", "secret", "password", "token", "access_token",
    "id_token", "refresh_token", "sandbox_token", "assertion", "client_assertion", "code_verifier", "signature", "sig",
    "state", "nonce",
    "x-amz-signature", "x-amz-credential", "x-amz-security-token",
)
"""Query/form parameter names whose values never reach a log line."""

FHIR_QUERY_KEPT = ("_count", "_offset", "_format", "_include", "_revinclude", "_type", "_since", "_outputFormat")
"""The query parameters of a FHIR URL whose values are kept in a log line: paging and format
controls, which name no patient. Every other value of a FHIR search (`family`, `birthdate`,
`identifier`, `code`, `patient`, the `_cursor` holding the EHR's own link...) is patient data or
points at it, and is redacted."""

SECRET_PATHS = ("/sandbox/signin/", "/console/invite/", "/invitations/")
"""Paths whose next segment is a one-time secret (a sandbox sign-in link, a console or a partner's
invitation): that segment never reaches a log line either."""

_PARAM = re.compile(r"(?i)(?<![\w-])(" + "|".join(re.escape(p) for p in SENSITIVE_PARAMS) + r")=[^&\s\"'#]*")
_JSON_FIELD = re.compile(r"(?i)(\"(?:" + "|".join(re.escape(p) for p in SENSITIVE_PARAMS) + r")\"\s*:\s*)\"[^\"]*\"")
_CREDENTIAL = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+")
_JWT = re.compile(r"eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*")
_FHIR_QUERY = re.compile(r"(?i)(/fhir/[^\s?#\"']*\?)([^\s#\"']+)")
_QUERY_VALUE = re.compile(r"([^&=]*)=([^&]*)")
_FHIR_KEPT = frozenset(FHIR_QUERY_KEPT)
_SECRET_PATH = re.compile("(" + "|".join(re.escape(p) for p in SECRET_PATHS) + r")[^/?#&\s\"']+")
# Text none of the five patterns can match (no `=`, no `"`, no `eyJ`, no bearer/basic, none of the
# secret paths) is returned as is: one scan instead of five substitutions for most fields of most lines.
_MAY_HOLD_SECRET = re.compile(r'[="]|eyJ|(?i:bearer|basic)|' + "|".join(re.escape(p) for p in SECRET_PATHS))


def _fhir_query(match: re.Match) -> str:
    return match.group(1) + _QUERY_VALUE.sub(
        lambda m: m.group(0) if m.group(1) in _FHIR_KEPT else f"{m.group(1)}={REDACTED}", match.group(2))


def redact(text: str) -> str:
    """`text` with secret values replaced by `[REDACTED]` (query params, JSON fields, credentials, JWTs,
    the secret segment of a one-time link's path) and so is every value of a FHIR URL's query but
    the paging controls (`FHIR_QUERY_KEPT`): a search names the patient it looks for."""
    if not text or not _MAY_HOLD_SECRET.search(text):
        return text
    text = _FHIR_QUERY.sub(_fhir_query, text)
    text = _PARAM.sub(lambda m: f"{m.group(1)}={REDACTED}", text)
    text = _JSON_FIELD.sub(lambda m: f'{m.group(1)}"{REDACTED}"', text)
    text = _CREDENTIAL.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    text = _SECRET_PATH.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    return _JWT.sub(REDACTED, text)


_PASSWORD_PARAM = re.compile(r"(?i)(^|&)((?:ssl)?password)=[^&]*")
"""A password given as a URL parameter (libpq's `password`, `sslpassword`; redis-py's `password`)."""


def redacted_url(url: str) -> str:
    """`url` without its password (in `user:password@` or as a `password=` parameter), for a
    message an operator may paste into a ticket."""
    head, mark, query = url.partition("?")
    if mark:
        query = _PASSWORD_PARAM.sub(r"\1\2=***", query)
    try:
        parts = urlsplit(head)
    except ValueError:  # e.g. an unclosed IPv6 bracket: nothing to tell the user from the password
        return "(a URL that cannot be parsed)"
    if parts.password is not None:
        netloc = parts.netloc.rsplit("@", 1)
        head = urlunsplit(parts._replace(netloc=f"{parts.username}:***@{netloc[-1]}"))
    return head + mark + query


# Attributes every LogRecord has; anything else was passed with `extra=` and goes into the line.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "request_id"}


_UNREDACTED = frozenset({"ts", "level", "logger", "request_id"})  # ours, never the caller's text
_LINE_JSON = json.JSONEncoder(default=str, separators=(",", ":"))  # built once, not per line
_JSON_TEXT = json.encoder.encode_basestring_ascii  # what _LINE_JSON writes for a str (C)
ACCESS_PARTS_KEPT = 1024  # access lines' fixed parts kept per formatter (emptied when full)


class AccessRecord(logging.LogRecord):
    """The record of one HTTP request's access line (`ops.observability.log_request`): a plain
    `LogRecord` of message `"%s %s %d"` (method, route, status) with the access fields as
    attributes, as `extra=` would give them. `JsonFormatter` writes it without walking the
    record's attributes, byte for byte the line the general path writes."""

    def __init__(self, name: str, level: int, request_id: str, method: str, route: str, path: str, status: int,
                 duration_ms: float, client: str):
        super().__init__(name, level, __file__, 0, "%s %s %d", (method, route, status), None, "log_request")
        self.request_id, self.method, self.route, self.path = request_id, method, route, path
        self.status, self.duration_ms, self.client = status, duration_ms, client
        self._size = len(self.__dict__) + 1  # with `_size` itself: an attribute added later shows


def _access_line(formatter: "JsonFormatter", record: AccessRecord) -> str | None:
    """The JSON line of an access record, or None when the general path must write it (an
    attribute added by a filter, a field of another type, a text that may hold a secret)."""
    if len(record.__dict__) != record._size or record.exc_info:
        return None
    return access_line(formatter, record.created, record.levelname, record.name, record.getMessage(),
                       record.request_id, record.method, record.route, record.path, record.status,
                       record.duration_ms, record.client)


def access_line(formatter: "JsonFormatter", created: float, levelname: str, name: str, message: str,
                request_id: str, method: str, route: str, path: str, status: int, duration_ms: float,
                client: str) -> str | None:
    """The line JsonFormatter's general path writes for an access record of these fields (its texts
    redacted as that path redacts them), or None when that path must write it (a field of another type).

    That path redacts the texts when any of them may hold a secret; `redact` leaves a text that
    cannot alone, so each text is redacted on its own, and the request id (never redacted) decides
    nothing. The JSON of the fields other than the time, the request id and the duration is kept
    per formatter for lines none of whose texts may hold a secret (a route's lines repeat them)."""
    if (not request_id or type(status) is not int or type(duration_ms) is not float
            or not type(method) is type(route) is type(path) is type(client) is type(request_id) is str):
        return None
    key = (levelname, name, message, method, route, path, status, client)
    parts = formatter.access_parts.get(key)
    if parts is None:
        clean = not _MAY_HOLD_SECRET.search(f"{levelname}\n{name}\n{message}\n{method}\n{route}\n{path}\n{client}")
        if not clean:  # a query (`?patient=…`) is enough: each text is redacted then
            message, method, route, path, client = (redact(t) for t in (message, method, route, path, client))
        parts = (f'"level":{_JSON_TEXT(levelname)},"logger":{_JSON_TEXT(name)},"message":{_JSON_TEXT(message)},',
                 f',"method":{_JSON_TEXT(method)},"route":{_JSON_TEXT(route)},"path":{_JSON_TEXT(path)},'
                 f'"status":{status!r},', _JSON_TEXT(client))
        if clean:  # nothing a secret could be in is kept
            if len(formatter.access_parts) >= ACCESS_PARTS_KEPT:
                formatter.access_parts.clear()
            formatter.access_parts[key] = parts
    head, middle, client_text = parts
    return (f'{{"ts":"{formatter.timestamp(created)}",{head}"request_id":{_JSON_TEXT(request_id)}{middle}'
            f'"duration_ms":{duration_ms!r},"client":{client_text}}}')


class JsonLineHandler(logging.StreamHandler):
    """The JSON handler `configure_logging` installs on the root logger. When it is the only
    handler an access record would reach (`sole_json_handler`), the access line is written to
    its stream directly (`emit_access`): the bytes, the lock and the flush `Handler.handle` would
    give, without making the record or walking the loggers for it."""

    _svc_json = True

    def emit_access(self, name: str, level: int, request_id: str, method: str, route: str, path: str,
                    status: int, duration_ms: float, client: str) -> bool:
        """Write the access line of these fields; False (nothing written) when the record must
        go the general way (another formatter, a field it cannot vouch for)."""
        formatter = self.formatter
        if type(formatter) is not JsonFormatter:
            return False
        line = access_line(formatter, time.time(), logging.getLevelName(level), name, f"{method} {route} {status}",
                           request_id, method, route, path, status, duration_ms, client)
        if line is None:
            return False
        self.acquire()
        try:
            self.stream.write(line + self.terminator)
            self.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(AccessRecord(name, level, request_id, method, route, path, status, duration_ms, client))
        finally:
            self.release()
        return True


def sole_json_handler(logger: logging.Logger, level: int) -> JsonLineHandler | None:
    """The JsonLineHandler a record of `level` from `logger` would reach alone: none of the
    logger's filters (the only logger filters a record meets), no other handler on the way up
    and no handler filter; else None."""
    if logger.filters or logger.disabled:
        return None
    found = None
    current = logger
    while current is not None:
        for handler in current.handlers:
            if level < handler.level:
                continue
            if found is not None or type(handler) is not JsonLineHandler or handler.filters:
                return None
            found = handler
        if not current.propagate:
            break
        current = current.parent
    return found


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, request_id, extras, exc."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._second: tuple[float, str] = (-1.0, "")  # the last whole second and its ISO text
        self.access_parts: dict[tuple, tuple[str, str, str]] = {}  # see `access_line`

    def timestamp(self, created: float) -> str:
        """`created` as ISO 8601 UTC with milliseconds, as `datetime.isoformat(timespec="milliseconds")`
        writes it (microseconds rounded the same way), the date and time formatted once a second."""
        fraction, whole = math.modf(created)
        micros = round(fraction * 1e6)
        if micros >= 1_000_000:
            whole, micros = whole + 1, micros - 1_000_000
        second, text = self._second
        if whole != second:
            text = dt.datetime.fromtimestamp(whole, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
            self._second = (whole, text)
        return f"{text}.{micros // 1000:03d}+00:00"

    def format(self, record: logging.LogRecord) -> str:
        if type(record) is AccessRecord:  # one per request: written directly (same bytes)
            line = _access_line(self, record)
            if line is not None:
                return line
        entry = {
            "ts": self.timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None) or request_id_var.get(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        texts = [value for value in entry.values() if isinstance(value, str)]
        # One scan of every text field (joined by a newline, which no pattern crosses) decides
        # whether any of them needs the four substitutions: most access-log lines need none.
        if _MAY_HOLD_SECRET.search("\n".join(texts)):
            for key, value in entry.items():
                if key not in _UNREDACTED and isinstance(value, str):
                    entry[key] = redact(value)
        if record.exc_info:
            entry["exc"] = redact(self.formatException(record.exc_info))
        return _LINE_JSON.encode(entry)


DATA_LOGGERS = ("peewee", "botocore", "boto3", "s3transfer", "urllib3")
"""Libraries whose debug lines carry the data they move: every SQL statement with its parameters
(patient names and dates of birth, disclosure records' queries, stored hashes), S3 requests with
their bodies and signed URLs. They log at INFO and above whatever `SVC_LOG_LEVEL` says."""


def configure_logging(level: str = "INFO", stream=None) -> logging.Handler:
    """Send every logger's records, as JSON lines, to `stream` (default stderr). Idempotent.
    `level` is every logger's but the `DATA_LOGGERS`', which never log below INFO."""
    root = logging.getLogger()
    for existing in list(root.handlers):
        if getattr(existing, "_svc_json", False):
            root.removeHandler(existing)
    handler = JsonLineHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    # basicConfig-style plain handlers would print the same records again, unredacted.
    for existing in list(root.handlers):
        if type(existing) is logging.StreamHandler and getattr(existing, "stream", None) in (sys.stderr, sys.stdout):
            root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level)
    for name in DATA_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.INFO, root.level))
    return handler
