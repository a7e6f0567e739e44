"""The tests' fixtures (only fixtures: helpers live in the tests/helpers/ package): a real service on
SQLite and on PostgreSQL, real HTTP, a movable clock, the worlds tests start from, and the processes
and browsers some tests drive. A fixture more than one test module uses is defined here, once.

Every test that uses `app`/`runtime` runs once per database backend (`sqlite`, `postgresql`).
Set SVC_TEST_DATABASES=sqlite (or postgresql) to run one backend only.
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import psycopg2
import pytest

from conf import Settings
from helpers.browser import CHROMIUM, CHROMIUM_ARGS, Demo
from helpers.environment import BACKENDS, PG_DSN, REDIS_URL, database_url
from helpers.fhir_ehr import start_fhir_ehr
from helpers.hostile_ehr import HostileEhr
from helpers.http import Api
from helpers.launch import Flow
from helpers.partner_app import Partner
from helpers.processes import free_port, settings_env, start_process, stop_process, wait_for_port
from helpers.s3 import AWS, worker_env, worker_settings
from helpers.worlds import SmartWorld, World
from models.schema import MODELS
from runtime import Runtime


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


@pytest.fixture
def scratch_database():
    """Makes empty PostgreSQL databases of this test (`scratch_database()` -> URL), dropped after it."""
    names = []

    def make() -> str:
        names.append(f"svc_auth_scratch_{os.getpid()}_{uuid.uuid4().hex[:8]}")
        admin = psycopg2.connect(PG_DSN + "/postgres")
        admin.autocommit = True
        admin.cursor().execute(f'CREATE DATABASE "{names[-1]}"')
        admin.close()
        return f"{PG_DSN}/{names[-1]}"
    yield make
    if names:
        admin = psycopg2.connect(PG_DSN + "/postgres")
        admin.autocommit = True
        for name in names:
            admin.cursor().execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


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
    server's real address, for clients that fetch its JWKS), `public_port="FIXTURE"` (the issuer and
    public address are 127.0.0.1 on the port that fixture gives, e.g. a proxy's), `redis=True` (the
    shared Redis, under this test's own `redis_namespace`), `workers=True` (Redis as `redis=True`, and
    a fresh bucket on moto's S3 server, its credentials in the environment: `helpers.s3`), and any
    `Settings` field."""
    marker = request.node.get_closest_marker("svc_settings")
    options = dict(marker.kwargs) if marker else {}
    own_keys, real_issuer = options.pop("own_keys", False), options.pop("real_issuer", False)
    public_port, redis, workers = options.pop("public_port", None), options.pop("redis", False), options.pop("workers", False)
    issuer = f"http://127.0.0.1:{request.getfixturevalue('http_port')}" if real_issuer else "http://127.0.0.1:8888"
    if public_port:
        issuer = options["public_url"] = f"http://127.0.0.1:{request.getfixturevalue(public_port)}"
    if redis:
        options.update(redis_url=REDIS_URL, redis_namespace=request.getfixturevalue("redis_namespace"))
    built = Settings.build(
        issuer=issuer, database_url=database_url(backend, tmp_path, request),
        var_dir=str(tmp_path / "var"), keys_dir=str(tmp_path / "keys" if own_keys else session_keys_dir),
        hmac_key="k" * 32,
        sandbox=True,  # the sandbox EHR is a testing tool: on in the tests (tests/test_sandbox_access.py turns it off)
        **options,
    )
    if workers:
        return worker_settings(built, request.getfixturevalue("s3_endpoint"), request.getfixturevalue("monkeypatch"),
                               request.getfixturevalue("redis_namespace"))
    return built


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


@pytest.fixture
def api(app, http_client, base_url, runtime):
    return Api(http_client, base_url, runtime)


@pytest.fixture
def world(runtime) -> World:
    """A clinic with a physician and a staff user, and an installed app (free-trial plan)."""
    return World.build(runtime)


@pytest.fixture
def smart_world(runtime, world) -> SmartWorld:
    """`world` with SMART apps: its app (confidential) and a public one with an allowed origin, both
    installed in the clinic and declaring every SMART scope, and a patient of the clinic's sandbox EHR."""
    return world.smart(runtime)


@pytest.fixture
def flow(api, world, runtime):
    return Flow(api, world, runtime)


# -- processes ---------------------------------------------------------------------------------

@pytest.fixture
def cli(settings):
    """Runs the operator CLI (`svc-auth ARGS...`) as a real process on the test's settings; asserts
    its exit status (`expect`, default 0) and returns the `CompletedProcess`."""
    import subprocess
    import sys
    from helpers.environment import ROOT
    env = settings_env(settings)

    def run(*args, expect=0):
        result = subprocess.run([sys.executable, "-m", "cli.__main__", *args], env=env, cwd=str(ROOT),
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == expect, result.stderr + result.stdout
        return result
    return run


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


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory):
    """moto's standalone S3-compatible server, a real HTTP server on a free loopback port."""
    port = free_port()
    env = {**os.environ, **AWS}
    proc = start_process(["-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], env,
                         log_path=tmp_path_factory.mktemp("moto") / "moto.log")
    wait_for_port(port, proc=proc)
    yield f"http://127.0.0.1:{port}"
    stop_process(proc)


@pytest.fixture
def start_worker(settings, tmp_path):
    """Starts `svc-auth worker --threads 2 [ARGS...]` processes on the test's settings (its task
    settings and moto's S3 credentials in their environment); each is stopped after the test."""
    env = worker_env(settings)
    procs = []

    def start(*args):
        proc = start_process(["worker", "--threads", "2", *args], env, log_path=tmp_path / f"worker{len(procs)}.log")
        procs.append(proc)
        return proc
    yield start
    for proc in procs:
        stop_process(proc)


@pytest.fixture(scope="module")
def fhir_ehr():
    """The real FHIR R4 EHR (tests/js/fhir_ehr.mjs) on a free port, one per test module."""
    ehr = start_fhir_ehr()
    yield ehr
    ehr.proc.terminate()
    ehr.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def hostile():
    """The hostile FHIR EHR (tests/helpers/hostile_ehr.py), one per test module; `calm()` it first."""
    ehr = HostileEhr()
    yield ehr
    ehr.close()


# -- the example partner app -------------------------------------------------------------------

@pytest.fixture
def partner(runtime, world, io_loop, http_server):
    """Makes example partner apps (`partner(**config overrides)`) served on their own ports, stopped
    after the test; their modules carry `helpers.partner_app.PARTNER_SETTINGS`."""
    made = []

    def make(**overrides):
        made.append(Partner(runtime, world, io_loop, **overrides))
        return made[-1]
    yield make
    for p in made:
        p.server.stop()


# -- browsers ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """`svc-auth serve --demo` on free ports, one per test module (`helpers.browser.Demo`)."""
    service = Demo(tmp_path_factory.mktemp("browser-demo"))
    yield service
    stop_process(service.proc)


@pytest.fixture
def page(tmp_path):
    """A headless Chromium page (a persistent profile of the test's own, 1200x760)."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1200, "height": 760})
        try:
            yield context.new_page()
        finally:
            context.close()
