"""Configuration: every setting of svc-auth, read once from the environment (and `.env`).

One `Settings` object is built at start (`Settings.from_env()`), validated, and handed to every
part of the service; nothing else reads `os.environ`.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from conf.logging import redacted_url


class ConfigError(ValueError):
    """A setting has a value the service cannot run with; the message names it."""


_SYNC_WINDOW = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-3]):([0-5]\d)$")


def read_env_file(path: Path, label: str | None = None) -> dict[str, str]:
    """Parse a `.env`-style file: KEY=VALUE lines, `#` comments, optional quotes. A file that cannot
    be read or is not UTF-8 is a `ConfigError` naming it (`label`, default its path)."""
    values: dict[str, str] = {}
    if not path.is_file():
        return values
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{label or path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{label or path}: not UTF-8 text") from None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        if line.startswith("export "):
            line = line[len("export "):]
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def _url(name: str, value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{name} must be an http(s) URL like https://auth.example.com, got {value!r}")
    return (parts.scheme + value[len(parts.scheme):]).rstrip("/")  # `HTTPS://` is https: (cookies' Secure)


_TEN_YEARS = 10 * 366 * 86400
S3_LONGEST_PRESIGNED_URL = 7 * 86400
"""The longest a Signature V4 presigned URL may live: S3 refuses one signed for longer."""
_UNITS = (("_BYTES", "bytes", 2 ** 50), ("_MS", "milliseconds", _TEN_YEARS * 1000), ("_DAYS", "days", 100 * 366),
          ("_PAGES", "pages", 1_000_000), ("_THREADS", "threads", 256))
"""A whole-number setting's unit and largest value, by the end of its name (else seconds, at most
ten years): past them a date overflows or threads are started without end, so refuse at start."""


def _seconds(name: str, value: str) -> int:
    """A positive whole number (seconds, milliseconds, bytes, pages or threads, as the setting's name
    says), no larger than its unit's bound (`_UNITS`)."""
    unit, largest = next(((u, top) for end, u, top in _UNITS if name.endswith(end)), ("seconds", _TEN_YEARS))
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number of {unit}, got {value!r}") from None
    if number <= 0:
        raise ConfigError(f"{name} must be positive, got {value!r}")
    if number > largest:
        raise ConfigError(f"{name} must be at most {largest} {unit}, got {value!r}")
    return number


def _at_least(name: str, value, minimum: int, what: str) -> int:
    """A whole number of at least `minimum`; `what` is what the error says it must be."""
    try:
        number = int(value)
    except ValueError:
        number = None
    if number is None or number < minimum:
        raise ConfigError(f"{name} must be {what}, got {value!r}")
    return number


def _key_ids(name: str, value) -> tuple:
    """Comma-separated key ids (16 hex digits each, as `serve` names them), or `disclosure-chain`,
    `totp-secrets` (what `serve` names to let go of instead of a key id)."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    ids = tuple(str(item).strip().lower() for item in items if str(item).strip())
    for one in ids:
        if one not in ("disclosure-chain", "totp-secrets") and (len(one) != 16 or any(c not in "0123456789abcdef" for c in one)):
            raise ConfigError(f"{name} must be a comma-separated list of key ids (16 hex digits each, as "
                              f"`svc-auth keys rekey --json` prints them), got {one!r}")
    return ids


def _utf8(name: str, value: str) -> str:
    """`value` when it is UTF-8 text; else a ConfigError naming the variable, never the value (it
    may be a key). Bytes in another encoding reach Python as lone surrogates, which every encoder
    refuses later with a traceback. (Directories are taken as the system gives them.)"""
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(f"{name} is not UTF-8 text (set in another encoding); give it in UTF-8") from None
    return value


EXAMPLE_HMAC_KEY = "change-me-to-64-random-hex-characters-shared-by-every-host-000000"
"""The placeholder of deploy/env.example: public, so never a key (`_refuse_placeholder`)."""


def _refuse_placeholder(name: str, key: str) -> None:
    """A key copied from deploy/env.example (or any value saying `change-me`) is public: every host
    would hash secrets, seal signing keys and link the audit chain under it. Refuse it at start."""
    if "change-me" in key.lower() or key == EXAMPLE_HMAC_KEY:
        raise ConfigError(f"{name} is the placeholder of deploy/env.example (it contains 'change-me'): set a "
                          "secret key, e.g. the output of `openssl rand -hex 32`, the same on every host")


def _hmac_keys(name: str, value) -> tuple:
    """Comma-separated keys (or a sequence of them), each at least 32 characters, in order."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    keys = tuple(str(item).strip() for item in items if str(item).strip())
    for key in keys:
        if len(key.encode("utf-8")) < 32:
            raise ConfigError(f"{name} must be a comma-separated list of keys of at least 32 characters each "
                              "(the earlier values of SVC_HMAC_KEY)")
        _refuse_placeholder(name, key)
    return keys


def _networks(name: str, value: str) -> tuple:
    nets = []
    for item in filter(None, (p.strip() for p in value.split(","))):
        try:
            nets.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ConfigError(f"{name} must be a comma-separated list of CIDR networks, got {item!r}") from None
    return tuple(nets)


_RATE_LIMIT = re.compile(r"^([a-z_]+)=(\d+)/(\d+)$")


def _rate_limits(name: str, value: str) -> tuple:
    """`invitations=10/60,appointments=100/60` -> ((operation, count, seconds), ...)."""
    limits = []
    for item in filter(None, (p.strip() for p in value.split(","))):
        m = _RATE_LIMIT.fullmatch(item)
        if not m or int(m[2]) < 1 or int(m[3]) < 1:
            raise ConfigError(f"{name} entries must look like operation=COUNT/SECONDS (e.g. appointments=50/60), "
                              f"got {item!r}")
        limits.append((m[1], int(m[2]), int(m[3])))
    return tuple(limits)


def _switch(name: str, value) -> bool:
    """on/off, true/false, yes/no, 1/0 (or a bool)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("on", "true", "yes", "1"):
        return True
    if text in ("off", "false", "no", "0", ""):
        return False
    raise ConfigError(f"{name} must be on or off, got {value!r}")


def _count_per_seconds(name: str, value: str) -> tuple:
    """`10/300` -> (10, 300)."""
    m = re.match(r"^\s*(\d+)\s*/\s*(\d+)\s*$", value)
    if not m or int(m[1]) < 1 or int(m[2]) < 1:
        raise ConfigError(f"{name} must look like COUNT/SECONDS (e.g. 10/300), got {value!r}")
    return int(m[1]), int(m[2])


@dataclass(frozen=True)
class Settings:
    """The whole configuration. Field names mirror the `SVC_*` variables, lower-cased."""

    issuer: str = "http://127.0.0.1:8888"
    public_url: str = ""
    database_url: str = "sqlite:///var/svc-auth.db"
    redis_url: str = ""
    # Key prefix of everything svc-auth stores in Redis (task queues, scheduler, rate limits), so
    # several deployments (or test sessions) can share one Redis.
    redis_namespace: str = "svc-auth"
    s3_endpoint_url: str = ""
    s3_bucket: str = ""
    # Chart ZIPs up to this size are one atomic PutObject; larger ones a multipart upload, which the
    # recovery sweep aborts when its build's lease lapses.
    s3_multipart_bytes: int = 64 * 1024 * 1024
    # Seconds an S3 call may take to connect, and to wait for each read of its answer: calls made
    # while an HTTP request waits (tried twice, then 503), and the workers' uploads (tried 5 times).
    s3_timeout: int = 5
    s3_batch_timeout: int = 60
    claims_namespace: str = ""
    demo_application_id: str = "demo-application"
    sync_window: str = "02:00-04:00"
    var_dir: str = "var"
    keys_dir: str = ""
    objects_dir: str = ""
    hmac_key: str = ""
    # Earlier SVC_HMAC_KEYs, comma-separated, while rotating it (docs/operations.md): what they made
    # still verifies and opens; everything new is made with SVC_HMAC_KEY.
    hmac_key_previous: tuple = ()
    # Ids of retired SVC_HMAC_KEYs (`serve` names them when it refuses to start) whose live secrets the operator
    # lets stop working: `serve` then starts without that key (docs/operations.md).
    hmac_key_retired: tuple = ()
    # Seconds a process's row in key_holder (the SVC_HMAC_KEY it links the disclosure chain under) counts as
    # live after its last heartbeat (one every quarter of it): `keys rekey` waits for live hosts on an old key.
    key_holder_window: int = 60
    # Lifetimes, seconds.
    code_ttl: int = 60
    launch_ttl: int = 300
    access_token_ttl: int = 300
    client_token_ttl: int = 300
    id_token_ttl: int = 3600
    sandbox_token_ttl: int = 1800
    # SMART refresh tokens (docs/smart.md): an `online_access` grant lives no longer than the
    # clinician's hub session and at most online_access_ttl; an `offline_access` grant
    # offline_access_ttl (90 days) unless its app says otherwise (`apps update --offline-access-ttl`).
    online_access_ttl: int = 12 * 3600
    offline_access_ttl: int = 90 * 24 * 3600
    # A rotated signing key is in the JWKS this long before it signs; the JWKS's Cache-Control
    # max-age is never longer (see keys/signing.py). 0: a new key signs at once.
    key_prepublish_seconds: int = 300
    # After `svc-auth ehr rotate-key`, the previous EHR client keys stay in /ehr/jwks.json this long
    # (EHRs cache svc-auth's JWKS), then are deleted, private halves included (keys/ehr_client.py).
    ehr_key_overlap_seconds: int = 24 * 3600
    presigned_url_ttl: int = 900
    # A ready chart's ZIP is deleted from the object store this long after it was built; its
    # request then reads `expired` (workers.recovery.expire_charts). A new request builds it again.
    chart_ttl: int = 7 * 24 * 3600
    invitation_ttl: int = 7 * 24 * 3600
    # Networks allowed to call the REST API (empty: any); proxies whose X-Forwarded-* we trust.
    rest_allowed_networks: tuple = ()
    trusted_proxies: tuple = ()
    # The sandbox EHR (hub, settings page, sign-in links, POST /v1/sandbox/launches) is a testing
    # tool: off unless SVC_SANDBOX=on (serve --demo turns it on). Its browser sessions last
    # sandbox_session_ttl; a sign-in link works once within sandbox_link_ttl.
    sandbox: bool = False
    sandbox_session_ttl: int = 12 * 3600
    sandbox_link_ttl: int = 900
    max_body_bytes: int = 64 * 1024
    # A connection that keeps `serve` waiting longer than this for a request's headers (idle
    # between keep-alive requests, or sending its headers slowly) is closed (ops/idle.py).
    idle_connection_timeout: int = 3600
    # serve's HTTP/1.1 connection under the Tornado application: "httptools" (llhttp's parser on the
    # loop's transport, ops/httpconn.py) or "tornado" (Tornado's HTTP1ServerConnection over IOStream).
    http_connection: str = "httptools"
    # `svc-auth hl7 listen` (docs/hl7-feed.md): a connection silent this long is closed; one whose
    # message has not ended this long after its first bytes were read is closed; a connection
    # beyond this many open ones is closed at once (half of them for senders proven: hl7feed/slots.py),
    # and so is one beyond this many from one peer address or IPv6 /64 (None: a quarter of
    # hl7_max_connections).
    hl7_idle_timeout: int = 300
    hl7_frame_timeout: int = 60
    hl7_max_connections: int = 200
    hl7_max_connections_per_peer: int | None = None
    # Partner REST API rate-limit overrides: "operation=COUNT/SECONDS,..." (see docs/rest-api.md).
    rate_limits: tuple = ()
    # FHIR API (docs/fhir-api.md, Limits): requests per application and clinic, and per access
    # token, "COUNT/SECONDS" (an app may have its own: `apps update --fhir-rate-limit`); and how many
    # proxied reads and searches one clinic's EHR may have in progress per serve process.
    fhir_rate_limit: tuple = (600, 60)
    fhir_token_rate_limit: tuple = (200, 60)
    fhir_ehr_concurrency: int = 4
    # Failed authentication attempts (client secrets, sandbox sign-in): "COUNT/SECONDS" per
    # subject (a client_id, an account) and per source address, in any SECONDS (a sliding count);
    # past them, 429 + Retry-After.
    auth_failure_limit: tuple = (10, 300)
    auth_address_failure_limit: tuple = (50, 300)
    # After `apps secret activate-fallback`, the retired secret is answered "retired by rotation"
    # (401, not counted as a failed guess) for this many seconds.
    retired_secret_grace: int = 30 * 24 * 3600
    log_level: str = "INFO"
    # Background work: retries of a failed task (exponential backoff between the two bounds),
    # worker threads of the in-process worker, and how long a connector session stays active
    # after it was last seen.
    task_max_retries: int = 5
    task_min_backoff_ms: int = 15_000
    task_max_backoff_ms: int = 15 * 60_000
    worker_threads: int = 2
    # Threads per serve process that run blocking work (database, S3, queue) off the IOLoop.
    db_threads: int = 8
    connector_session_ttl: int = 24 * 3600
    # Bounds on calls to a clinic's EHR (connectors/bounds.py; docs/security.md). Interactive: the
    # FHIR API's proxied reads and searches and the hub page, each call whole within the deadline
    # (seconds, every request, retry and page included), bodies up to MAX_BYTES, searches up to
    # MAX_PAGES pages. Batch: the night and chart builds, each request within its deadline.
    ehr_interactive_deadline: int = 10
    ehr_interactive_max_bytes: int = 4 * 1024 * 1024
    ehr_interactive_max_pages: int = 20
    ehr_batch_deadline: int = 120
    ehr_batch_max_bytes: int = 32 * 1024 * 1024
    ehr_batch_max_pages: int = 1000
    # A chart build's requests to the EHR together, every page of every search (seconds): past it the
    # request fails, naming the deadline (each request still has the batch deadline).
    chart_build_deadline: int = 1800
    # One clinic's nightly snapshot build, from its start to its last row (seconds): past it the build
    # stops at its next EHR request or batch of rows, that clinic's night fails naming the deadline, and
    # its previous snapshot stays published (each request still has the batch deadline).
    snapshot_build_deadline: int = 1800
    # Developer console: a session unused for this long is signed out, and any session this long
    # after its sign-in, however busy (an absolute lifetime: a stolen cookie is not good forever).
    console_idle_timeout: int = 30 * 60
    console_session_lifetime: int = 12 * 3600
    # Console device cookies (console/devices.py): how long the cookie a sign-in gives a browser
    # keeps it a trusted device, exempt from the account's and the address's sign-in lockouts.
    console_device_cookie_lifetime: int = 180 * 24 * 3600
    # Console sign-in: failures allowed per account and per source address in any SECONDS, "COUNT/SECONDS"
    # (and per device cookie, for a browser with one of the account: console/devices.py).
    console_signin_failure_limit: tuple = (5, 900)
    # A chart request or snapshot whose worker died is found and re-queued within this many
    # seconds (the delivery guarantee of docs/workers.md).
    task_recovery_seconds: int = 120
    # Bulk Data exports (docs/bulk-data.md): an app's exports in progress at once, how long a finished
    # export's files are kept, and the size at which a type's ndjson is split into another file.
    bulk_max_concurrent: int = 2
    bulk_file_ttl: int = 24 * 3600
    bulk_file_max_bytes: int = 16 * 1024 * 1024
    # The disclosure audit (docs/audit.md): on by default; turning it off is audited at every start.
    # Records older than the retention are removed only by `svc-auth audit prune` (6 years by default).
    disclosure_audit: bool = True
    # Processes bring an older schema up to date when they start (one at a time, under a lock). Off:
    # they refuse a pending schema with one line, and the operator runs `svc-auth db migrate`.
    auto_migrate: bool = True
    disclosure_retention_days: int = 6 * 365 + 2
    # TEST ONLY: seconds added to the wall clock of this process (child processes of the tests run
    # "tomorrow night" this way). Never set it in a deployment.
    clock_offset: float = 0.0

    @classmethod
    def from_env(cls, environ: dict | None = None, dotenv: str | Path | None = ".env") -> "Settings":
        """Build settings from `environ` (default `os.environ`) over an optional `.env` file."""
        env: dict[str, str] = {}
        if dotenv:
            env.update(read_env_file(Path(dotenv)))
        env.update(os.environ if environ is None else environ)
        kwargs: dict = {}
        for f in dataclasses.fields(cls):
            name = "SVC_" + f.name.upper()
            if name in env and env[name] != "":
                kwargs[f.name] = _utf8(name, env[name]) if not name.endswith("_DIR") else env[name]
        return cls.build(**kwargs)

    @classmethod
    def build(cls, **values) -> "Settings":
        """Validate and normalise raw values (strings from the environment, or typed values)."""
        defaults = cls()
        merged = {f.name: values.get(f.name, getattr(defaults, f.name))
                  for f in dataclasses.fields(cls)}
        merged["issuer"] = _url("SVC_ISSUER", str(merged["issuer"]))
        merged["public_url"] = _url("SVC_PUBLIC_URL", str(merged["public_url"] or merged["issuer"]))
        if merged["s3_endpoint_url"] or merged["s3_bucket"]:
            if not merged["s3_bucket"]:
                raise ConfigError("SVC_S3_BUCKET is required when SVC_S3_ENDPOINT_URL is set")
        if merged["redis_url"] and not str(merged["redis_url"]).startswith(("redis://", "rediss://", "unix://")):
            raise ConfigError(f"SVC_REDIS_URL must be a redis:// URL, got {redacted_url(str(merged['redis_url']))!r}")
        scheme = str(merged["database_url"]).split(":", 1)[0]
        if scheme not in ("sqlite", "postgres", "postgresql", "postgresext", "postgresqlext"):
            raise ConfigError(f"SVC_DATABASE_URL must be sqlite:///path or postgresql://..., got {redacted_url(str(merged['database_url']))!r}")
        if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", str(merged["redis_namespace"])):
            raise ConfigError(f"SVC_REDIS_NAMESPACE must be 1-64 letters, digits or _.:-, got {merged['redis_namespace']!r}")
        try:
            merged["task_max_retries"] = int(merged["task_max_retries"])
            if merged["task_max_retries"] < 0:
                raise ValueError
        except ValueError:
            raise ConfigError(f"SVC_TASK_MAX_RETRIES must be 0 or more, got {merged['task_max_retries']!r}") from None
        if merged["http_connection"] not in ("httptools", "tornado"):
            raise ConfigError(f"SVC_HTTP_CONNECTION must be httptools or tornado, got {merged['http_connection']!r}")
        if not _SYNC_WINDOW.fullmatch(str(merged["sync_window"])):
            raise ConfigError(f"SVC_SYNC_WINDOW must look like 02:00-04:00 (UTC), got {merged['sync_window']!r}")
        for name in ("code_ttl", "launch_ttl", "access_token_ttl", "client_token_ttl", "id_token_ttl",
                     "sandbox_token_ttl", "online_access_ttl", "offline_access_ttl", "presigned_url_ttl", "chart_ttl", "invitation_ttl", "max_body_bytes",
                     "idle_connection_timeout", "hl7_idle_timeout", "hl7_frame_timeout",
                     "task_min_backoff_ms", "task_max_backoff_ms", "worker_threads", "connector_session_ttl",
                     "db_threads", "sandbox_session_ttl", "sandbox_link_ttl", "task_recovery_seconds",
                     "console_idle_timeout", "console_session_lifetime", "console_device_cookie_lifetime",
                     "s3_multipart_bytes", "s3_timeout", "s3_batch_timeout", "key_holder_window", "retired_secret_grace", "disclosure_retention_days",
                     "ehr_interactive_deadline",
                     "ehr_interactive_max_bytes", "ehr_interactive_max_pages", "ehr_batch_deadline",
                     "ehr_batch_max_bytes", "ehr_batch_max_pages", "chart_build_deadline", "snapshot_build_deadline",
                     "bulk_file_ttl", "bulk_file_max_bytes"):
            merged[name] = _seconds("SVC_" + name.upper(), str(merged[name]))
        merged["fhir_ehr_concurrency"] = _at_least("SVC_FHIR_EHR_CONCURRENCY", merged["fhir_ehr_concurrency"], 1,
                                                   "a whole number of requests, 1 or more")
        merged["hl7_max_connections"] = _at_least("SVC_HL7_MAX_CONNECTIONS", merged["hl7_max_connections"], 1,
                                                  "a whole number of connections, 1 or more")
        merged["hl7_max_connections_per_peer"] = (
            max(1, merged["hl7_max_connections"] // 4) if merged["hl7_max_connections_per_peer"] is None
            else _at_least("SVC_HL7_MAX_CONNECTIONS_PER_PEER", merged["hl7_max_connections_per_peer"], 1,
                           "a whole number of connections, 1 or more"))
        merged["bulk_max_concurrent"] = _at_least("SVC_BULK_MAX_CONCURRENT", merged["bulk_max_concurrent"], 1,
                                                  "a whole number of exports, 1 or more")
        if merged["presigned_url_ttl"] > S3_LONGEST_PRESIGNED_URL:
            raise ConfigError(f"SVC_PRESIGNED_URL_TTL must be at most {S3_LONGEST_PRESIGNED_URL} seconds (S3 signs no URL "
                              f"for longer than 7 days), got {merged['presigned_url_ttl']}")
        if merged["key_holder_window"] < 4:
            raise ConfigError(f"SVC_KEY_HOLDER_WINDOW must be at least 4 seconds, got {merged['key_holder_window']}")
        if merged["task_recovery_seconds"] < 3:
            raise ConfigError(f"SVC_TASK_RECOVERY_SECONDS must be at least 3, got {merged['task_recovery_seconds']}")
        try:
            merged["clock_offset"] = float(merged["clock_offset"])
        except ValueError:
            raise ConfigError(f"SVC_CLOCK_OFFSET must be a number of seconds, got {merged['clock_offset']!r}") from None
        if not math.isfinite(merged["clock_offset"]) or abs(merged["clock_offset"]) > _TEN_YEARS:
            # nan and inf compare false with everything (every expiry check would pass or fail at
            # once); 1e300 overflows the first date. TEST ONLY in any case: bounded, never silent.
            raise ConfigError(f"SVC_CLOCK_OFFSET (test only) must be a finite number of seconds within "
                              f"±{_TEN_YEARS} (ten years), got {merged['clock_offset']!r}")
        merged["key_prepublish_seconds"] = _at_least("SVC_KEY_PREPUBLISH_SECONDS", merged["key_prepublish_seconds"], 0,
                                                     "0 or more seconds")
        merged["ehr_key_overlap_seconds"] = _at_least("SVC_EHR_KEY_OVERLAP_SECONDS", merged["ehr_key_overlap_seconds"],
                                                      0, "0 or more seconds")
        for name in ("rest_allowed_networks", "trusted_proxies"):
            if isinstance(merged[name], str):
                merged[name] = _networks("SVC_" + name.upper(), merged[name])
        merged["sandbox"] = _switch("SVC_SANDBOX", merged["sandbox"])
        merged["disclosure_audit"] = _switch("SVC_DISCLOSURE_AUDIT", merged["disclosure_audit"])
        merged["auto_migrate"] = _switch("SVC_AUTO_MIGRATE", merged["auto_migrate"])
        for name in ("auth_failure_limit", "auth_address_failure_limit", "console_signin_failure_limit",
                     "fhir_rate_limit", "fhir_token_rate_limit"):
            if isinstance(merged[name], str):
                merged[name] = _count_per_seconds("SVC_" + name.upper(), merged[name])
        if isinstance(merged["rate_limits"], str):
            merged["rate_limits"] = _rate_limits("SVC_RATE_LIMITS", merged["rate_limits"])
        if not merged["claims_namespace"]:
            merged["claims_namespace"] = urlsplit(merged["issuer"]).hostname or "localhost"
        var = Path(merged["var_dir"])
        merged["keys_dir"] = merged["keys_dir"] or str(var / "keys")
        merged["objects_dir"] = merged["objects_dir"] or str(var / "objects")
        merged["log_level"] = str(merged["log_level"]).upper()
        if merged["hmac_key"] and len(str(merged["hmac_key"]).encode("utf-8")) < 32:
            raise ConfigError("SVC_HMAC_KEY must be at least 32 characters (for example the output of "
                              "`openssl rand -hex 32`), or unset to generate one in SVC_KEYS_DIR")
        if merged["hmac_key"]:
            _refuse_placeholder("SVC_HMAC_KEY", str(merged["hmac_key"]))
        merged["hmac_key_previous"] = _hmac_keys("SVC_HMAC_KEY_PREVIOUS", merged["hmac_key_previous"])
        merged["hmac_key_retired"] = _key_ids("SVC_HMAC_KEY_RETIRED", merged["hmac_key_retired"])
        if merged["task_max_backoff_ms"] < merged["task_min_backoff_ms"]:
            raise ConfigError("SVC_TASK_MAX_BACKOFF_MS must not be below SVC_TASK_MIN_BACKOFF_MS")
        return cls(**merged)

    def replace(self, **changes) -> "Settings":
        """A copy with some settings changed, validated again (tests and the demo use this)."""
        values = dataclasses.asdict(self)
        values.update(changes)
        return Settings.build(**values)

    @property
    def jwks_max_age(self) -> int:
        """How long relying parties may cache the JWKS: half the key pre-publication time (at most
        300 s), so a new key is in every cached copy before it signs, with the other half as a margin
        for a copy served just before a process reloaded its keys, or by a host whose clock is ahead."""
        return min(300, self.key_prepublish_seconds // 2)

    @property
    def issuer_claim(self) -> str:
        """`iss` of every token we sign: the issuer address with a trailing slash (spec)."""
        return self.issuer + "/"

    @property
    def sync_window_bounds(self) -> tuple[tuple[int, int], tuple[int, int]]:
        m = _SYNC_WINDOW.fullmatch(self.sync_window)
        return (int(m[1]), int(m[2])), (int(m[3]), int(m[4]))
