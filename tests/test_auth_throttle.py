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
    app = world.app
    runtime.clock.advance(300 - runtime.clock.time() % 300 + 0.5)  # one window for the whole test
    trust_local_proxy(runtime)
    # The legitimate client works from its own address (which earns it nothing: no address is trusted).
    assert (await client_token(api, app.client_id, world.secret, LEGIT))[0] == 200
    # An attacker guesses: 10 wrong secrets are checked (401), then wrong secrets are refused (429).
    for n in range(10):
        status, _, body = await client_token(api, app.client_id, f"guess-{n}", ATTACKER)
        assert status == 401 and body["error"] == "invalid_client", (n, body)
    status, headers, body = await client_token(api, app.client_id, "guess-x", ATTACKER)
    assert status == 429 and body["error"] == "too_many_attempts"
    assert 1 <= int(headers["Retry-After"]) <= 300
    # Wrong secrets from any other address are refused for this client as well, the legitimate
    # client's own address included (its earlier success does not exempt its failures) ...
    assert (await client_token(api, app.client_id, "guess-y", "203.0.113.10"))[0] == 429
    assert (await client_token(api, app.client_id, "guess-z", LEGIT))[0] == 429
    # ... and at introspection too (same client authentication).
    status, _, _ = await api.call("POST", "/v1/oauth/introspect", {
        "token": "x", "client_id": app.client_id, "client_secret": "guess-z"}, headers=via(ATTACKER))
    assert status == 429
    # The right secret is never refused: from its own address, a new one, even the attacker's
    # (a 256-bit secret is not guessable; refusing it would let anyone lock the client out).
    for address in (LEGIT, "192.0.2.44", ATTACKER):
        status, _, body = await client_token(api, app.client_id, world.secret, address)
        assert status == 200, (address, body)
    status, _, body = await api.call("POST", "/v1/oauth/token", body="grant_type=client_credentials", headers={
        "Content-Type": "application/x-www-form-urlencoded", **via("192.0.2.45"),
        "Authorization": basic_auth(app.client_id, world.secret)})
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
    app = world.app
    assert (await client_token(api, app.client_id, world.secret, LEGIT))[0] == 200


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
    with pytest.raises(Throttled):
        second.check(("client", "c1"), "10.0.0.3")  # any address: the subject is locked
    now[0] += 60
    second.check(("client", "c1"), "10.0.0.2")


def test_a_locked_subject_is_locked_for_every_address():
    """No address is exempt: the subject's failures lock it wherever the next attempt comes from."""
    now = [1_000_000.0]
    throttle = FailureThrottle("console_signin", FailurePolicy(subject=Limit(5, 900), address=Limit(100, 900)),
                               lambda: now[0])
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
        throttle.check(("client", "d"), f"2001:db8:2::{i:x}")
    assert time.perf_counter() - started < 2.0


@pytest.mark.gen_test
async def test_a_spray_of_wrong_secrets_cannot_lock_the_client_out_of_a_new_host(api, world, runtime, redis_namespace):
    """The lock-out we measured: after 50 wrong secrets for a (public) client_id from one address,
    the partner's backend moved to a new host got 429 for 5 minutes. Its right secret is answered."""
    use_redis(runtime, redis_namespace)
    runtime.clock.advance(300 - runtime.clock.time() % 300 + 0.5)
    trust_local_proxy(runtime)  # the new host reaches us through a trusted proxy (X-Forwarded-For)
    app = world.app
    statuses = [(await client_token(api, app.client_id, f"spray-{n}", ATTACKER))[0] for n in range(50)]
    assert statuses[:10] == [401] * 10 and set(statuses[10:]) == {429}
    status, _, body = await client_token(api, app.client_id, world.secret, "198.51.100.200")
    assert status == 200 and body["token_type"] == "Bearer", body


@pytest.mark.gen_test
async def test_an_address_that_once_succeeded_is_throttled_like_any_other(api, world, runtime, redis_namespace):
    """The open door we measured: 200 wrong secrets from an address that once succeeded all got 401
    and were never throttled. Its failures count like anyone's."""
    use_redis(runtime, redis_namespace)
    runtime.clock.advance(300 - runtime.clock.time() % 300 + 0.5)
    trust_local_proxy(runtime)
    app = world.app
    assert (await client_token(api, app.client_id, world.secret, LEGIT))[0] == 200
    statuses = [(await client_token(api, app.client_id, f"wrong-{n}", LEGIT))[0] for n in range(12)]
    assert statuses == [401] * 10 + [429] * 2


def test_wrong_secrets_are_throttled_across_serve_processes(settings, world, tmp_path, redis_namespace):
    """Two real `svc-auth serve` processes on one Redis: wrong secrets counted by one lock the
    client at the other (429 + Retry-After), while the right secret is answered by both."""
    import json
    import urllib.error
    import urllib.request

    from conftest import free_port, settings_env, start_process, stop_process
    import time
    ports = [free_port(), free_port()]
    # Both processes' clocks start a failure window (300 s) 1 s from now, so the spray never
    # straddles a window boundary, where the counts start again.
    offset = 300 - time.time() % 300 + 1
    env = settings_env(settings, SVC_REDIS_URL=REDIS_URL, SVC_REDIS_NAMESPACE=redis_namespace,
                       SVC_CLOCK_OFFSET=offset)
    procs = [start_process(["serve", "--port", str(port)], env, port, log_path=tmp_path / f"serve{port}.log")
             for port in ports]

    def token(port: int, secret: str) -> tuple[int, dict, dict]:
        body = json.dumps({"grant_type": "client_credentials", "client_id": world.app.client_id,
                           "client_secret": secret}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/oauth/token", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=20) as response:
                return response.status, dict(response.headers), json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), json.loads(err.read())
    try:
        first, second = ports
        assert [token(first, f"wrong-{n}")[0] for n in range(10)] == [401] * 10
        status, headers, body = token(second, "wrong-at-the-other")
        assert status == 429 and body["error"] == "too_many_attempts" and 1 <= int(headers["Retry-After"]) <= 300
        assert token(first, world.secret)[0] == 200 and token(second, world.secret)[0] == 200
    finally:
        for proc in procs:
            stop_process(proc)
