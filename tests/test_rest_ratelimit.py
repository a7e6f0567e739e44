"""Rate limits of the partner API: per client and operation, in memory and in Redis, across processes."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
import redis

from helpers.environment import REDIS_URL
from helpers.processes import free_port, settings_env, start_process, stop_process
from helpers.rest import partner_headers
from lifecycle.applications import register_application
from ratelimit import build_rate_limiter
from ratelimit.policy import DEFAULT_LIMITS


async def exhaust(api, path, headers, limit):
    for n in range(limit):
        status, resp_headers, body = await api.call("GET", path, headers=headers)
        assert status == 200, body
        assert resp_headers["RateLimit-Limit"] == str(limit)
        assert resp_headers["RateLimit-Remaining"] == str(limit - n - 1)
        assert 1 <= int(resp_headers["RateLimit-Reset"]) <= DEFAULT_LIMITS["organizations"].seconds


async def check_limits(api, world, runtime):
    clock = runtime.clock
    app = world.app
    headers = await partner_headers(api, app, world.secret)
    path = f"/v1/applications/{app.id}/organizations"
    clock.advance(60 - clock.time() % 60 + 0.5)  # start of a window, so the test does not straddle two
    headers = await partner_headers(api, app, world.secret)
    await exhaust(api, path, headers, DEFAULT_LIMITS["organizations"].count)
    status, resp_headers, body = await api.call("GET", path, headers=headers)
    assert status == 429 and body["error"] == "rate_limited"
    assert resp_headers["Retry-After"] == resp_headers["RateLimit-Reset"]
    assert resp_headers["RateLimit-Remaining"] == "0"
    # other operations and other clients have their own counts
    status, resp_headers, _ = await api.call("GET", f"{path}/{world.org.id}/users", headers=headers)
    assert status == 200 and resp_headers["RateLimit-Limit"] == str(DEFAULT_LIMITS["users"].count)
    other, other_secret = register_application(runtime, "Other", "https://o.example/m", "https://o.example/l")
    other_headers = await partner_headers(api, other, other_secret)
    status, _, _ = await api.call("GET", f"/v1/applications/{other.id}/organizations", headers=other_headers)
    assert status == 200
    # errors after the limiter still carry the headers
    status, resp_headers, _ = await api.call("GET", f"{path}/org_unknown/users", headers=headers)
    assert status == 404 and "RateLimit-Remaining" in resp_headers
    # the next window allows requests again
    clock.advance(60)
    status, _, _ = await api.call("GET", path, headers=await partner_headers(api, app, world.secret))
    assert status == 200


@pytest.mark.gen_test
async def test_in_memory_limit(api, world, runtime):
    await check_limits(api, world, runtime)


@pytest.mark.gen_test
async def test_redis_limit(api, world, runtime, redis_namespace):
    runtime.rate_limiter = build_rate_limiter(runtime.settings.replace(redis_url=REDIS_URL,
                                                                       redis_namespace=redis_namespace),
                                              runtime.clock)
    await check_limits(api, world, runtime)
    assert list(redis.Redis.from_url(REDIS_URL).scan_iter(f"{redis_namespace}:ratelimit:*"))


@pytest.mark.gen_test
async def test_redis_unreachable_is_a_clear_503(api, world, runtime):
    runtime.rate_limiter = build_rate_limiter(runtime.settings.replace(
        redis_url=f"redis://127.0.0.1:{free_port()}/0"), runtime.clock)
    headers = await partner_headers(api, world.app, world.secret)
    status, resp_headers, body = await api.call("GET", "/v1/appointments/123456789", headers=headers)
    assert status == 503 and body["error"] == "rate_limiter_unavailable" and "Redis" in body["message"]
    assert resp_headers["Retry-After"]


def _get(port, path, headers=None, body=None):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, err.headers, json.loads(err.read())


@pytest.mark.slow
def test_two_serve_processes_share_one_redis_limit(world, settings, redis_namespace, tmp_path):
    # A one-day window (SVC_RATE_LIMITS override) so the run cannot straddle a window boundary.
    env = settings_env(settings, SVC_REDIS_URL=REDIS_URL, SVC_REDIS_NAMESPACE=redis_namespace,
                       SVC_RATE_LIMITS="organizations=10/86400")
    ports = [free_port(), free_port()]
    procs = [start_process(["serve", "--port", str(p)], env, p, log_path=tmp_path / f"serve-{p}.log")
             for p in ports]
    try:
        app = world.app
        status, _, token = _get(ports[0], "/v1/oauth/token", {"Content-Type": "application/json"}, json.dumps({
            "grant_type": "client_credentials", "client_id": app.client_id,
            "client_secret": world.secret}).encode())
        assert status == 200, token
        headers = {"Authorization": f"Bearer {token['access_token']}"}
        path = f"/v1/applications/{app.id}/organizations"
        # Alternate between the two processes: together they allow exactly the limit.
        results = [_get(ports[n % 2], path, headers) for n in range(16)]
        statuses = [r[0] for r in results]
        assert statuses == [200] * 10 + [429] * 6, statuses
        assert [r[1]["RateLimit-Remaining"] for r in results[:10]] == [str(9 - n) for n in range(10)]
    finally:
        for proc in procs:
            stop_process(proc)


def test_memory_limiter_drops_passed_windows_whole_and_never_rebuilds_its_table_per_request():
    """Issue 36: once more than 10,000 counters were live (one per FHIR token per minute), every
    request copied the whole table under the lock. Now passed windows are dropped as a new one
    opens: 3,000 requests among 30,000 live counters take no longer than a plain dict's work
    (before: 3,000 rebuilds of 30,000 entries, tens of seconds)."""
    import asyncio
    import time
    from models.clock import Clock
    from ratelimit.limiter import MemoryRateLimiter
    from ratelimit.policy import Limit

    clock = Clock()
    # 1 s into an hour: every hit below falls in the same minute, and the minute's end below (+60 s)
    # is not also the hour's (aligned to the minute only, the test failed when run at hh:59).
    clock.advance(-(clock.time() % 3600) + 1)
    limiter = MemoryRateLimiter({"fhir_read": Limit(5, 60), "token": Limit(100, 3600)}, clock)

    async def run():
        for n in range(30_000):
            await limiter.hit(f"token-{n}", "fhir_read")
        await limiter.hit_all([("app-1", Limit(10, 60)), ("app-1:hour", Limit(100, 3600))])
        began = time.process_time()
        for n in range(3_000):
            decision = await limiter.hit(f"token-{n}", "fhir_read")
            assert decision.allowed and decision.remaining == 3
        assert time.process_time() - began < 2.0
        assert len(limiter) == 30_002
        clock.advance(60)  # the minute has passed: its 30,001 counters go at the next hit, the hour's stays
        assert (await limiter.hit("token-0", "fhir_read")).remaining == 4
        assert len(limiter) == 2
        refused = [await limiter.hit("token-0", "fhir_read") for _ in range(5)][-1]
        assert not refused.allowed and 1 <= refused.reset <= 60

    asyncio.run(run())


@pytest.mark.gen_test
async def test_a_bad_path_id_is_a_limited_answer_too(api, world, runtime):
    """Every answer after authentication is limited and says so (docs/rest-api.md, CONTRACTS): a
    path id of the wrong shape was refused before the limiter, so its 400 carried no `RateLimit-*`
    headers and did not count, and a client could send such requests without end. Still refused
    before any lookup or disclosure record."""
    from models.disclosures import DisclosureRecord
    headers = await partner_headers(api, world.app, world.secret)
    limit = DEFAULT_LIMITS["appointments"].count
    for n in range(limit):
        status, resp_headers, body = await api.call("GET", "/v1/appointments/bad%20id", headers=headers)
        assert (status, body["error"]) == (400, "invalid_path_parameter")
        assert resp_headers["RateLimit-Limit"] == str(limit) and resp_headers["RateLimit-Remaining"] == str(limit - n - 1)
    status, resp_headers, body = await api.call("GET", "/v1/appointments/bad%20id", headers=headers)
    assert status == 429 and body["error"] == "rate_limited" and resp_headers["Retry-After"]
    assert DisclosureRecord.select().count() == 0
