"""Shared fixtures: a real service on SQLite and on PostgreSQL, real HTTP, a movable clock.

Every test that uses `app`/`runtime` runs once per database backend (`sqlite`, `postgresql`).
Set SVC_TEST_DATABASES=sqlite (or postgresql) to run one backend only.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import base64
import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import uuid
from pathlib import Path

import psycopg2
import pytest

from conf import Settings
from runtime import Runtime
from models.schema import MODELS
from openapi_contract import check_response  # every response is checked against /v1/openapi.json

ROOT = Path(__file__).resolve().parent.parent
PG_DSN = os.environ.get("SVC_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432")
REDIS_URL = os.environ.get("SVC_TEST_REDIS", "redis://127.0.0.1:6379/0")
BACKENDS = [b for b in os.environ.get("SVC_TEST_DATABASES", "sqlite,postgresql").split(",") if b]


@pytest.fixture(scope="session")
def session_keys_dir(tmp_path_factory) -> Path:
    """A key file in the pre-database layout: every test's fresh database imports it (the one-time
    migration) instead of generating an RSA key per test."""
    from keys.signing import generate_key_file
    directory = tmp_path_factory.mktemp("keys")
    generate_key_file(directory)
    return directory


@pytest.fixture(scope="session")
def postgres_url():
    """A fresh PostgreSQL database for this test session, dropped at the end."""
    name = f"svc_auth_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = psycopg2.connect(PG_DSN + "/postgres")
    admin.autocommit = True
    admin.cursor().execute(f'CREATE DATABASE "{name}"')
    yield f"{PG_DSN}/{name}"
    admin.cursor().execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


def database_url(backend: str, tmp_path: Path, request) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'svc.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def redis_namespace():
    """A Redis key namespace of this test only (the Redis is shared with other test sessions);
    its keys are deleted afterwards. Never FLUSHDB: other sessions use the same server."""
    import redis
    namespace = f"test-{uuid.uuid4().hex[:12]}"
    yield namespace
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(f"{namespace}:*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture
def settings(backend, tmp_path, session_keys_dir, request) -> Settings:
    """Settings of a service under test (temp dirs; `var_dir` is per test), the one settings fixture.

    A module or test adjusts them with `@pytest.mark.svc_settings(...)`: `own_keys=True` (signing
    keys per test, for tests that rotate them), `real_issuer=True` (the issuer is the test HTTP
    server's real address, for clients that fetch its JWKS), and any `Settings` field."""
    marker = request.node.get_closest_marker("svc_settings")
    options = dict(marker.kwargs) if marker else {}
    own_keys, real_issuer = options.pop("own_keys", False), options.pop("real_issuer", False)
    issuer = f"http://127.0.0.1:{request.getfixturevalue('http_port')}" if real_issuer else "http://127.0.0.1:8888"
    return Settings.build(
        issuer=issuer, database_url=database_url(backend, tmp_path, request),
        var_dir=str(tmp_path / "var"), keys_dir=str(tmp_path / "keys" if own_keys else session_keys_dir),
        hmac_key="k" * 32,
        sandbox=True,  # the sandbox EHR is a testing tool: on in the tests (tests/test_sandbox_access.py turns it off)
        **options,
    )


@pytest.fixture
def runtime(settings):
    rt = Runtime(settings)  # with its own clock, at the real time
    rt.migrate()
    if settings.database_url.startswith("postgres"):
        tables = ", ".join(f'"{m._meta.table_name}"' for m in MODELS)
        with rt.db.atomic():  # disclosure_record refuses TRUNCATE outside its maintenance switch (docs/audit.md)
            rt.db.execute_sql("SET LOCAL svc_auth.disclosure_maintenance = 'on'")
            rt.db.execute_sql(f"TRUNCATE {tables} CASCADE")
    yield rt
    rt.close()


@pytest.fixture
def clock(runtime):
    """The service clock of the test's runtime: tests move time through the runtime."""
    return runtime.clock


@pytest.fixture
def app(runtime):
    """The Tornado application pytest-tornado serves on a free port (real HTTP)."""
    from server import make_app
    runtime.changes.start()  # as `serve` does: changes made by CLI child processes reach this process
    return make_app(runtime)


# -- helpers used by many tests ---------------------------------------------------------------

class Api:
    """Small HTTP client over pytest-tornado's `http_client`: JSON in, (status, headers, body) out."""

    def __init__(self, http_client, base_url, runtime=None):
        self.http = http_client
        self.base_url = base_url
        self.runtime = runtime

    async def call(self, method, path, json_body=None, body=None, headers=None, follow_redirects=False):
        headers = dict(headers or {})
        if json_body is not None:
            body = json.dumps(json_body)
            headers.setdefault("Content-Type", "application/json")
        if method in ("POST", "PUT", "PATCH") and body is None:
            body = b""
        response = await self.http.fetch(self.base_url + path, method=method, body=body, headers=headers,
                                         raise_error=False, follow_redirects=follow_redirects)
        check_response(method, response.effective_url, response.code, response.headers, response.body)
        try:
            payload = json.loads(response.body) if response.body else None
        except ValueError:
            payload = response.body.decode("utf-8", "replace")
        return response.code, response.headers, payload


@pytest.fixture
def api(app, http_client, base_url, runtime):
    return Api(http_client, base_url, runtime)


async def sandbox_signin(api, runtime, user_id: str, app: str | None = None, target: str = "hub"):
    """Sign in to the sandbox EHR the way a person does (a one-time link); returns (Cookie header
    dict, the link's redirect Location)."""
    from lifecycle.sandbox import SESSION_COOKIE, create_signin_link
    url = create_signin_link(runtime, user_id, app, target=target)
    status, headers, body = await api.call("GET", urllib.parse.urlsplit(url).path)
    assert status == 302, body
    cookies = [c for c in headers.get_list("Set-Cookie") if c.startswith(SESSION_COOKIE + "=")]
    assert cookies, headers
    return {"Cookie": cookies[0].split(";")[0]}, headers["Location"]


def basic_auth(client_id: str, secret: str) -> str:
    raw = f"{urllib.parse.quote(client_id)}:{urllib.parse.quote(secret)}".encode()
    return "Basic " + base64.b64encode(raw).decode()


@dataclasses.dataclass
class World:
    """What `world` makes: a clinic, its physician and staff user, an installed app and its secret,
    and each user's sandbox token."""
    org: Any
    physician: Any
    staff: Any
    app: Any
    secret: str
    sandbox_token: str
    staff_sandbox_token: str


@pytest.fixture
def world(runtime) -> World:
    """A clinic with a physician and a staff user, and an installed app (free-trial plan)."""
    from lifecycle.applications import install_application, register_application
    from lifecycle.organizations import create_organization
    from lifecycle.users import create_user
    from lifecycle.sandbox import issue_sandbox_token
    org = create_organization("Test Clinic", "sandbox", "https://ehr.example/test")
    physician = create_user(org.id, "doc@example.com", "Doc", "Tor", "dtor", "1234567893")
    staff = create_user(org.id, "staff@example.com", "Staff", "Member", "smember")
    app, secret = register_application(
        runtime, "Test App", "https://app.example.com/main", "https://app.example.com/launch",
        billing_plan="free_trial", user_fields=["email", "name", "ehrUsername", "organization"])
    install_application(app.id, org.id)
    return World(org=org, physician=physician, staff=staff, app=app, secret=secret,
                 sandbox_token=issue_sandbox_token(runtime, physician),
                 staff_sandbox_token=issue_sandbox_token(runtime, staff))


class Flow:
    """Walks the launch flow over HTTP: launch -> authorize -> token."""

    def __init__(self, api, world, runtime):
        self.api, self.world, self.runtime = api, world, runtime

    async def launch(self, sandbox_token=None, client_id=None):
        from lifecycle.sandbox import issue_sandbox_token
        token = sandbox_token or issue_sandbox_token(self.runtime, self.world.physician)
        status, _, body = await self.api.call(
            "POST", "/v1/sandbox/launches", {"client_id": client_id or self.world.app.client_id},
            headers={"Authorization": f"Bearer {token}"})
        assert status == 201, body
        return body["launch_id"]

    async def authorize(self, prefix="/v1", **params):
        app = self.world.app
        query = {"client_id": app.client_id, "redirect_uri": app.redirect_uri, "response_type": "code"}
        if "launch_id" not in params and "login_hint" not in params:
            query["launch_id"] = await self.launch()
        query.update({k: v for k, v in params.items() if v is not None})
        status, headers, body = await self.api.call("GET", f"{prefix}/oauth/authorize?{urllib.parse.urlencode(query)}")
        return status, headers, body

    async def code(self, prefix="/v1", **params):
        status, headers, body = await self.authorize(prefix, **params)
        assert status == 302, body
        location = urllib.parse.urlsplit(headers["Location"])
        return urllib.parse.parse_qs(location.query)["code"][0]

    async def exchange(self, code, prefix="/v1", secret=None, **extra):
        app = self.world.app
        body = {"grant_type": "authorization_code", "client_id": app.client_id,
                "client_secret": secret or self.world.secret, "code": code, **extra}
        return await self.api.call("POST", f"{prefix}/oauth/token", body)

    async def tokens(self, prefix="/v1"):
        status, headers, body = await self.exchange(await self.code(prefix), prefix)
        assert status == 200, body
        return body


@pytest.fixture
def flow(api, world, runtime):
    return Flow(api, world, runtime)


# -- processes ---------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def settings_env(settings: Settings, **extra) -> dict:
    """Environment that makes a child `svc-auth` process read the same settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SVC_")}
    for name in ("issuer", "public_url", "database_url", "redis_url", "s3_endpoint_url", "s3_bucket",
                 "claims_namespace", "redis_namespace", "demo_application_id", "sync_window", "var_dir", "keys_dir",
                 "objects_dir", "hmac_key", "ehr_interactive_deadline", "ehr_interactive_max_bytes",
                 "ehr_interactive_max_pages", "ehr_batch_deadline", "ehr_batch_max_bytes", "ehr_batch_max_pages"):
        value = getattr(settings, name, None)
        if value:
            env["SVC_" + name.upper()] = str(value)
    env["SVC_SANDBOX"] = "on" if settings.sandbox else "off"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def wait_for_port(port: int, timeout: float = 60.0, proc=None) -> None:
    """Until something accepts on `port`; a `proc` that exits fails at once. The bound is long
    because a Python process's imports can take tens of seconds on a loaded 2-core machine (a
    clean-clone run beside other work missed 20 s once) and costs nothing when it starts."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on port {port}")


def start_process(args: list[str], env: dict, port: int | None = None, log_path: Path | None = None):
    """Start `svc-auth ARGS...` (or another module) and wait until `port` accepts connections."""
    out = open(log_path, "wb") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen([sys.executable, "-m", "cli.__main__", *args] if args and args[0] != "-m" else
                            [sys.executable, *args], env=env, cwd=str(ROOT), stdout=out, stderr=subprocess.STDOUT)
    if port:
        wait_for_port(port, proc=proc)
    return proc


def stop_process(proc, timeout: float = 10.0) -> int:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def wait_until(condition, timeout: float = 60.0, what: str = "condition"):
    """Poll `condition()` every 0.1 s until it returns something truthy (returned), or fail."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def live(settings, world, tmp_path):
    """A real `svc-auth serve` on a free port over the test's database and `world`; yields its
    issuer (its own address)."""
    port = free_port()
    issuer = f"http://127.0.0.1:{port}"
    env = settings_env(settings, SVC_ISSUER=issuer, SVC_PUBLIC_URL=issuer)
    proc = start_process(["serve", "--port", str(port)], env, port, log_path=tmp_path / "serve.log")
    yield issuer
    stop_process(proc)

