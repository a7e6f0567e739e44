"""Hot paths: database round trips per request, one-statement code exchange, deny-list revocation,
and the in-memory application cache following changes."""
from __future__ import annotations

import dataclasses

import json
import threading

import pytest
import redis
from jose import jwt

from helpers.environment import REDIS_URL
from helpers.http import basic_auth
from helpers.statements import StatementCounter
from oauth.secret_rotation import activate_fallback_secret, generate_fallback_secret
from models.application import Organization
from models.grants import AuthorizationCode
from oauth.denylist import DatabaseDenyList, RedisDenyList


@pytest.fixture(params=["database", "redis"])
def denylist(request, runtime, redis_namespace):
    """Both deny-lists: the database table (no SVC_REDIS_URL) and Redis keys."""
    if request.param == "redis":
        runtime.denylist = RedisDenyList(REDIS_URL, redis_namespace, runtime.clock)
    else:
        runtime.denylist = DatabaseDenyList(runtime.clock)
    yield request.param
    runtime.denylist.close()


async def client_token(api, world):
    return await api.call("POST", "/v1/oauth/token", {"grant_type": "client_credentials"},
                          headers={"Authorization": basic_auth(world.app.client_id, world.secret)})


@pytest.mark.gen_test
async def test_client_credentials_warm_makes_no_database_round_trip(api, world, runtime):
    assert (await client_token(api, world))[0] == 200  # warms the application cache and the keys
    with StatementCounter(runtime.db) as counter:
        for _ in range(3):
            status, _, body = await client_token(api, world)
            assert status == 200, body
    assert counter.statements == []


@pytest.mark.gen_test
async def test_a_warm_right_secret_makes_no_redis_command_and_no_sql_with_redis_configured(api, world, runtime):
    """Production shape (failure counts in Redis): the right secret of a cached client is one HMAC
    compare and one signature; neither Redis (a server of this test's own, so every command it
    counts is ours) nor the database is asked. A wrong secret does reach Redis: the counter works."""
    from bench.instances import LocalRedis
    from ratelimit.failures import build_failure_throttle
    redis_server = LocalRedis()
    redis_server.start()
    try:
        runtime.settings = runtime.settings.replace(redis_url=redis_server.url)
        runtime.client_auth_throttle = build_failure_throttle(runtime.settings, "client_auth",
                                                              runtime.failure_policy(), runtime.clock.time)
        info = redis.Redis.from_url(redis_server.url)

        def commands() -> int:  # the INFO call itself is one command
            return int(info.info("stats")["total_commands_processed"])
        assert (await client_token(api, world))[0] == 200  # warms the application cache and the keys
        before = commands()
        with StatementCounter(runtime.db) as counter:
            for _ in range(5):
                status, _, body = await client_token(api, world)
                assert status == 200, body
        assert commands() - before == 1 and counter.statements == []
        status, _, _ = await api.call("POST", "/v1/oauth/token", {"grant_type": "client_credentials"},
                                      headers={"Authorization": basic_auth(world.app.client_id, "wrong")})
        assert status == 401 and commands() - before > 2
    finally:
        redis_server.destroy()


@pytest.mark.gen_test
async def test_code_exchange_is_one_statement(api, flow, world, runtime):
    await client_token(api, world)  # warm
    code = await flow.code()
    with StatementCounter(runtime.db) as counter:
        status, _, body = await flow.exchange(code)
    assert status == 200, body
    assert len(counter.statements) == 1 and counter.statements[0].lstrip().upper().startswith("UPDATE")
    # A replay: the same one statement, plus the deny-list write of the first use's jti.
    with StatementCounter(runtime.db) as counter:
        status, _, _ = await flow.exchange(code)
    assert status == 400
    assert counter.statements[0].lstrip().upper().startswith("UPDATE")


@pytest.mark.gen_test
async def test_code_replay_revokes_through_the_deny_list(api, flow, world, runtime, denylist):
    code = await flow.code()
    status, _, first = await flow.exchange(code)
    assert status == 200
    auth = {"Authorization": f"Bearer {first['access_token']}"}
    introspect = {"token": first["access_token"], "client_id": world.app.client_id,
                  "client_secret": world.secret}
    assert (await api.call("GET", "/v1/oauth/userinfo", headers=auth))[0] == 200
    assert (await api.call("POST", "/v1/oauth/introspect", introspect))[2]["active"] is True
    jti = jwt.get_unverified_claims(first["access_token"])["jti"]
    assert AuthorizationCode.get(AuthorizationCode.used_at.is_null(False)).issued_jtis == jti  # noted on the code
    status, _, body = await flow.exchange(code)
    assert status == 400 and body["error"] == "invalid_grant"
    assert runtime.denylist.is_denied(jti)
    status, headers, _ = await api.call("GET", "/v1/oauth/userinfo", headers=auth)
    assert status == 401 and 'error="invalid_token"' in headers["WWW-Authenticate"]
    assert (await api.call("POST", "/v1/oauth/introspect", introspect))[2] == {"active": False}
    # Other tokens stay valid.
    other = await flow.tokens()
    assert (await api.call("GET", "/v1/oauth/userinfo",
                           headers={"Authorization": f"Bearer {other['access_token']}"}))[0] == 200


@pytest.mark.gen_test
async def test_a_denied_client_token_is_refused_by_the_rest_api(api, world, runtime, denylist):
    status, _, body = await client_token(api, world)
    headers = {"Authorization": f"Bearer {body['access_token']}"}
    path = f"/v1/applications/{world.app.id}/organizations"
    assert (await api.call("GET", path, headers=headers))[0] == 200
    runtime.denylist.deny([jwt.get_unverified_claims(body["access_token"])["jti"]], until=runtime.clock.time() + 300)
    assert (await api.call("GET", path, headers=headers))[0] == 401


def test_concurrent_exchanges_of_one_code_issue_once(runtime, world):
    """The consuming statement decides: of many racing exchanges exactly one gets tokens."""
    from oauth.authorization_code import AuthorizationCodeGrant
    from oauth.errors import OAuthError
    from models.grants import expiry
    app = world.app
    AuthorizationCode.create(code_hash=runtime.hasher.digest("race"), application=app.id,
                             user=world.physician.id, organization=world.org.id,
                             redirect_uri=app.redirect_uri, expires_at=expiry(runtime.clock.now(), 60))
    results, barrier = [], threading.Barrier(6)

    def exchange():
        barrier.wait()
        try:
            results.append(AuthorizationCodeGrant(runtime).exchange(app, {"code": "race"}, True))
        except OAuthError as exc:
            results.append(exc.error)
        finally:
            runtime.db.close()

    threads = [threading.Thread(target=exchange) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(isinstance(r, dict) for r in results) == 1 and results.count("invalid_grant") == 5


def test_redeem_reads_the_user_and_the_installation(runtime, world):
    from models.grants import expiry
    app, now = world.app, runtime.clock.now()
    AuthorizationCode.create(code_hash="h1", application=app.id, user=world.physician.id,
                             organization=world.org.id, redirect_uri=app.redirect_uri, nonce="n",
                             expires_at=expiry(runtime.clock.now(), 60))
    grant = AuthorizationCode.redeem(runtime.db, "h1", app.id, now, "jti-1")
    assert grant.first_use and grant.issued_jtis == ["jti-1"] and grant.nonce == "n"
    assert (grant.user.id, grant.user.email, grant.user.given_name) == (
        world.physician.id, "doc@example.com", "Doc")
    assert grant.installation is not None and grant.installation.trial_started_at is None
    assert grant.expires_at > now
    again = AuthorizationCode.redeem(runtime.db, "h1", app.id, now, "jti-2")
    assert not again.first_use and again.issued_jtis == ["jti-1"]
    assert AuthorizationCode.redeem(runtime.db, "h1", "app_other", now, "jti-3") is None
    assert AuthorizationCode.redeem(runtime.db, "unknown", app.id, now, "jti-4") is None
    elsewhere = Organization.create(name="Elsewhere")
    AuthorizationCode.create(code_hash="h2", application=app.id, user=world.physician.id,
                             organization=elsewhere.id, redirect_uri=app.redirect_uri, expires_at=expiry(runtime.clock.now(), 60))
    assert AuthorizationCode.redeem(runtime.db, "h2", app.id, now, "jti-5").installation is None


@pytest.mark.gen_test
async def test_secret_rotation_reaches_the_warm_cache(api, world, runtime):
    app_id = world.app.id
    assert (await client_token(api, world))[0] == 200  # cached now
    fallback = generate_fallback_secret(runtime, app_id)
    activate_fallback_secret(runtime, app_id)
    assert (await client_token(api, world))[0] == 401
    world = dataclasses.replace(world, secret=fallback)
    assert (await client_token(api, world))[0] == 200


def test_change_feed_poll_refreshes_listeners_of_changed_topics(runtime):
    heard = []
    runtime.changes.subscribe("applications", lambda: heard.append("applications"))
    assert set(runtime.changes.poll()) <= {"applications", "directory"}  # the first poll catches up with the fixtures' writes
    heard.clear()
    # Another process's change: only the version row moves.
    p = runtime.db.param
    runtime.db.execute_sql(
        f'INSERT INTO "change_version" (topic, version) VALUES ({p}, 1) '
        f'ON CONFLICT (topic) DO UPDATE SET version = "change_version".version + 1', ("applications",))
    assert runtime.changes.poll() == ["applications"] and heard == ["applications"]
    assert runtime.changes.poll() == []


@pytest.mark.gen_test
async def test_deny_list_unreachable_is_503_not_a_live_token(api, flow, runtime):
    from helpers.processes import free_port
    tokens = await flow.tokens()
    runtime.denylist = RedisDenyList(f"redis://127.0.0.1:{free_port()}/0", "nowhere", runtime.clock)
    # Raw fetch: the OpenAPI document's 503 responses are the outage work's (issue 11, item 3).
    response = await api.http.fetch(api.base_url + "/v1/oauth/userinfo", raise_error=False,
                                    headers={"Authorization": f"Bearer {tokens['access_token']}"})
    assert response.code == 503 and response.headers["Retry-After"]
    assert json.loads(response.body)["error"] == "temporarily_unavailable"


def test_an_older_database_is_migrated(runtime):
    """A database of the previous version: codes without `issued_jtis`, one `issued_token` row per
    token. `migrate` adds the column, keeps the table and its rows (issue 36), once."""
    from models.schema import SchemaVersion
    db = runtime.db
    db.execute_sql('ALTER TABLE "authorization_code" DROP COLUMN "issued_jtis"')
    db.execute_sql('CREATE TABLE "issued_token" ("jti" VARCHAR(64) PRIMARY KEY)')
    db.execute_sql("""INSERT INTO "issued_token" ("jti") VALUES ('jti-of-an-older-release')""")
    SchemaVersion.delete().execute()
    done = runtime.migrate()
    assert any("issued_jtis" in step for step in done) and any("issued_token" in step for step in done)
    assert "issued_jtis" in {c.name for c in db.get_columns("authorization_code")}
    assert db.execute_sql('SELECT "jti" FROM "issued_token"').fetchall() == [("jti-of-an-older-release",)]
    assert not any(step.startswith("migration") for step in runtime.migrate())


def test_only_a_cached_client_with_its_right_secret_is_answered_without_the_pool(runtime, world):
    from oauth.token_endpoint import in_memory_client
    from oauth.variants import VARIANTS
    v1 = next(v for v in VARIANTS if v.prefix == "/v1")
    app = world.app
    good = {"grant_type": "client_credentials", "client_id": app.client_id, "client_secret": world.secret}
    basic = basic_auth(app.client_id, world.secret)
    runtime.applications.clear()
    assert in_memory_client(runtime, v1, good, None) is None  # not cached yet: the pool reads it
    runtime.applications.by_client_id(app.client_id)
    assert in_memory_client(runtime, v1, good, None).id == app.id
    assert in_memory_client(runtime, v1, {"grant_type": "client_credentials"}, basic).id == app.id
    assert in_memory_client(runtime, v1, {"grant_type": "client_credentials", "client_id": app.client_id},
                            basic).id == app.id
    # Basic and another client_id in the body: the pool path answers invalid_request.
    assert in_memory_client(runtime, v1, {"grant_type": "client_credentials", "client_id": "cli_other"}, basic) is None
    assert in_memory_client(runtime, v1, {**good, "client_secret": "wrong"}, None) is None  # failures are counted
    assert in_memory_client(runtime, v1, {**good, "grant_type": "authorization_code"}, None) is None
    assert in_memory_client(runtime, v1, good, basic) is None  # both methods: the error comes from the pool path
    assert in_memory_client(runtime, v1, {**good, "client_assertion": "x",
                                          "client_assertion_type": "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"},
                            None) is None
    runtime.settings = runtime.settings.replace(redis_url=REDIS_URL)  # the right secret never asks the throttle
    assert in_memory_client(runtime, v1, good, None).id == app.id


@pytest.mark.gen_test
async def test_an_unknown_client_id_costs_no_database_round_trip_once_seen(api, world, runtime):
    """A wrong secret for an unknown client_id asked the database every time: a spray cost a query
    per attempt and answered slower than a known client (a timing oracle). The application cache
    now remembers the miss until an application changes."""
    from lifecycle.applications import register_application
    unknown = "cli_" + "5" * 24

    async def attempt(secret="wrong"):
        return await api.call("POST", "/v1/oauth/token", {"grant_type": "client_credentials"},
                              headers={"Authorization": basic_auth(unknown, secret)})
    with StatementCounter(runtime.db) as counter:
        assert (await attempt())[0] == 401
        assert any("application" in sql for sql in counter.statements)
        counter.reset()
        for _ in range(3):
            assert (await attempt())[0] == 401
        assert counter.statements == []
    # Registering that client_id is announced: the miss is forgotten at once.
    app, secret = register_application(runtime, "Late", "https://late.example/cb", "https://late.example/launch",
                                       None, "paid", ["email"], [], client_id=unknown)
    assert (await attempt(secret))[0] == 200
