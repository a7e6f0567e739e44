"""Failed client authentication is throttled per client_id and per address (in memory and in Redis)."""
from __future__ import annotations

import ipaddress

import pytest

from conftest import REDIS_URL, basic_auth
from models.audit import AuditEvent
from ratelimit.failures import FailurePolicy, FailureThrottle, Throttled
from ratelimit.policy import Limit

LEGIT = "198.51.100.7"
ATTACKER = "203.0.113.9"


def via(address: str) -> dict:
    return {"X-Forwarded-For": address}


async def client_token(api, client_id, secret, address, path="/v1/oauth/token"):
    return await api.call("POST", path, {"grant_type": "client_credentials", "client_id": client_id,
                                         "client_secret": secret}, headers=via(address))


def trust_local_proxy(runtime):
    """The test client connects from 127.0.0.1; let it speak for other addresses through XFF."""
    runtime.settings = runtime.settings.replace(trusted_proxies=(ipaddress.ip_network("127.0.0.1/32"),))


def use_redis(runtime, namespace):
    from ratelimit.failures import build_failure_throttle
    settings = runtime.settings.replace(redis_url=REDIS_URL, redis_namespace=namespace)
    runtime.client_auth_throttle = build_failure_throttle(settings, "client_auth", runtime.failure_policy(),
                                                          lambda: runtime.clock.time())


async def guess_secrets(api, world, runtime):
    app = world["app"]
    runtime.clock.advance(300 - runtime.clock.time() % 300 + 0.5)  # one window for the whole test
    trust_local_proxy(runtime)
    # The legitimate client works from its own address (this makes the address trusted for it).
    assert (await client_token(api, app.client_id, world["secret"], LEGIT))[0] == 200
    # An attacker guesses: 10 wrong secrets are checked (401), then the next attempts are refused unchecked.
    for n in range(10):
        status, _, body = await client_token(api, app.client_id, f"guess-{n}", ATTACKER)
        assert status == 401 and body["error"] == "invalid_client", (n, body)
    status, headers, body = await client_token(api, app.client_id, "guess-x", ATTACKER)
    assert status == 429 and body["error"] == "too_many_attempts"
    assert 1 <= int(headers["Retry-After"]) <= 300
    # Even the right secret from the attacker's address is refused: no oracle while locked.
    assert (await client_token(api, app.client_id, world["secret"], ATTACKER))[0] == 429
    # Another address the client never succeeded from is locked for this client as well ...
    assert (await client_token(api, app.client_id, "guess-y", "203.0.113.10"))[0] == 429
    # ... and at introspection too (same client authentication).
    status, _, _ = await api.call("POST", "/v1/oauth/introspect", {
        "token": "x", "client_id": app.client_id, "client_secret": "guess-z"}, headers=via(ATTACKER))
    assert status == 429
    # The legitimate client with its right secret keeps working from its own address.
    status, _, body = await client_token(api, app.client_id, world["secret"], LEGIT)
    assert status == 200, body
    status, _, body = await api.call("POST", "/v1/oauth/token", body="grant_type=client_credentials", headers={
        "Content-Type": "application/x-www-form-urlencoded", **via(LEGIT),
        "Authorization": basic_auth(app.client_id, world["secret"])})
    assert status == 200, body
    # The lockout is audited.
    events = list(AuditEvent.select().where(AuditEvent.action == "auth.lockout"))
    assert events and any(e.detail["address"] == ATTACKER for e in events)
    assert all(e.subject == f"client:{app.client_id}" for e in events)
    # The next window checks secrets again.
    runtime.clock.advance(300)
    assert (await client_token(api, app.client_id, "guess-next", ATTACKER))[0] == 401


@pytest.mark.gen_test
async def test_secret_guessing_is_throttled_in_memory(api, world, runtime):
    await guess_secrets(api, world, runtime)


@pytest.mark.gen_test
async def test_secret_guessing_is_throttled_in_redis(api, world, runtime, redis_namespace):
    use_redis(runtime, redis_namespace)
    await guess_secrets(api, world, runtime)


@pytest.mark.gen_test
async def test_one_address_trying_many_clients_is_locked(api, world, runtime):
    runtime.clock.advance(300 - runtime.clock.time() % 300 + 0.5)
    trust_local_proxy(runtime)
    for n in range(50):
        status, _, _ = await client_token(api, f"client-{n}", "secret", ATTACKER)
        assert status == 401
    assert (await client_token(api, "client-x", "secret", ATTACKER))[0] == 429
    # A malformed Basic header from that address is refused too, and other addresses are unaffected.
    status, _, _ = await api.call("POST", "/v1/oauth/token", body="grant_type=client_credentials", headers={
        "Content-Type": "application/x-www-form-urlencoded", "Authorization": "Basic !!!", **via(ATTACKER)})
    assert status == 429
    app = world["app"]
    assert (await client_token(api, app.client_id, world["secret"], LEGIT))[0] == 200


def test_redis_counts_are_shared_between_processes(redis_namespace):
    """Two throttles on one Redis namespace (two `serve` processes) see one count."""
    now = [1_000_000.0]
    policy = FailurePolicy(subject=Limit(3, 60), address=Limit(100, 60))
    first, second = (FailureThrottle("client_auth", policy, lambda: now[0], REDIS_URL, redis_namespace)
                     for _ in range(2))
    first.failed(("client", "c1"), "10.0.0.1")
    second.failed(("client", "c1"), "10.0.0.1")
    assert first.failed(("client", "c1"), "10.0.0.1") == [("client", "c1"), ("client", "c1", "address", "10.0.0.1")]
    with pytest.raises(Throttled) as err:
        second.check(("client", "c1"), "10.0.0.2")
    assert err.value.retry_after == 20
    first.succeeded(("client", "c1"), "10.0.0.3")
    second.check(("client", "c1"), "10.0.0.3")  # trusted for c1: passes
    with pytest.raises(Throttled):
        second.check(("client", "c1"), "10.0.0.1")  # its own pair is locked regardless
    now[0] += 60
    second.check(("client", "c1"), "10.0.0.2")


def test_without_trust_exemption_the_subject_locks_for_everyone():
    """`exempt_trusted=False` (people's passwords): earlier successes do not shield an address."""
    now = [1_000_000.0]
    throttle = FailureThrottle("console_signin", FailurePolicy(subject=Limit(5, 900), address=Limit(100, 900),
                                                               exempt_trusted=False), lambda: now[0])
    throttle.succeeded(("account", "a@x.example"), "10.0.0.1")
    for _ in range(5):
        throttle.check(("account", "a@x.example"), "10.0.0.1")
        throttle.failed(("account", "a@x.example"), "10.0.0.1")
    with pytest.raises(Throttled):
        throttle.check(("account", "a@x.example"), "10.0.0.1")
    with pytest.raises(Throttled):
        throttle.check(("account", "a@x.example"), "10.0.0.2")
    throttle.check(("account", "b@x.example"), "10.0.0.1")  # another account from that address


def test_many_live_counters_do_not_make_every_attempt_scan_them_all():
    """In memory, past 10,000 live counters (a spray of addresses within one window) each attempt
    used to rebuild the whole table to prune it; pruning is now amortised, so an attempt stays cheap."""
    import time
    now = [1_000_000.0]
    throttle = FailureThrottle("client_auth", FailurePolicy(), lambda: now[0])
    for i in range(12_000):  # one live per-address counter each
        throttle.failed(None, f"2001:db8::{i:x}")
    started = time.perf_counter()
    for i in range(2_000):
        throttle.failed(("client", "c"), f"2001:db8:1::{i:x}")
        throttle.succeeded(("client", "c"), f"2001:db8:2::{i:x}")
    assert time.perf_counter() - started < 2.0
