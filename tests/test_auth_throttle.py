"""Failed client authentication is throttled per client_id and per address (in memory and in Redis),
by a sliding count: at most the limit in any window's span, and a lock lasts until the oldest
failure it counted is a window old."""
from __future__ import annotations

import http.client
import ipaddress
import json
import time
from pathlib import Path

import pytest

from helpers.environment import REDIS_URL
from helpers.http import basic_auth
from helpers.metrics import requests_per_process
from helpers.processes import free_port, settings_env, start_process, stop_process, wait_until_listening
from helpers.throttle import expected_waits, just_before_a_boundary
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


def configured(runtime) -> FailurePolicy:
    """The limits as configured (SVC_AUTH_FAILURE_LIMIT per client, SVC_AUTH_ADDRESS_FAILURE_LIMIT
    per address). The count slides: no test needs to start at any particular time."""
    return runtime.failure_policy()


def trust_local_proxy(runtime):
    """The test client connects from 127.0.0.1; let it speak for other addresses through XFF."""
    runtime.settings = runtime.settings.replace(trusted_proxies=(ipaddress.ip_network("127.0.0.1/32"),))


def use_redis(runtime, namespace):
    from ratelimit.failures import build_failure_throttle
    settings = runtime.settings.replace(redis_url=REDIS_URL, redis_namespace=namespace)
    runtime.client_auth_throttle = build_failure_throttle(settings, "client_auth", runtime.failure_policy(),
                                                          lambda: runtime.clock.time(), runtime.hasher)


async def guess_secrets(api, world, runtime):
    app = world.app
    limit = configured(runtime).subject
    trust_local_proxy(runtime)
    # The legitimate client works from its own address (which earns it nothing: no address is trusted).
    assert (await client_token(api, app.client_id, world.secret, LEGIT))[0] == 200
    # An attacker guesses: the allowed wrong secrets (10) are checked (401), then refused (429).
    for n in range(limit.count):
        status, _, body = await client_token(api, app.client_id, f"guess-{n}", ATTACKER)
        assert status == 401 and body["error"] == "invalid_client", (n, body)
    status, headers, body = await client_token(api, app.client_id, "guess-x", ATTACKER)
    assert status == 429 and body["error"] == "too_many_attempts"
    assert 1 <= int(headers["Retry-After"]) <= limit.seconds
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
    # Once the oldest counted failure is a window old, secrets are checked again.
    runtime.clock.advance(limit.seconds)
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
    address_limit = configured(runtime).address
    trust_local_proxy(runtime)
    for n in range(address_limit.count):
        status, _, _ = await client_token(api, f"client-{n}", "secret", ATTACKER)
        assert status == 401
    assert (await client_token(api, "client-x", "secret", ATTACKER))[0] == 429
    # A malformed Basic header from that address is refused too, and other addresses are unaffected.
    status, _, _ = await api.call("POST", "/v1/oauth/token", body="grant_type=client_credentials", headers={
        "Content-Type": "application/x-www-form-urlencoded", "Authorization": "Basic !!!", **via(ATTACKER)})
    assert status == 429
    app = world.app
    assert (await client_token(api, app.client_id, world.secret, LEGIT))[0] == 200


@pytest.mark.gen_test
async def test_one_ipv6_64_trying_many_clients_is_one_address(api, world, runtime):
    """Each IPv6 address had its own counter, so one host with a /64 (2^64 addresses) was never
    locked: console sign-ins (an Argon2 hash each) could fill the pool. A /64 is counted as one."""
    address_limit = configured(runtime).address
    trust_local_proxy(runtime)
    for n in range(address_limit.count):
        status, _, _ = await client_token(api, f"client-{n}", "secret", f"2001:db8:7:7::{n + 1:x}")
        assert status == 401
    assert (await client_token(api, "client-x", "secret", "2001:db8:7:7:ffff::1"))[0] == 429
    assert (await client_token(api, "client-y", "secret", "2001:db8:7:8::1"))[0] == 401  # the next /64: its own


def test_redis_counts_are_shared_between_processes(redis_namespace):
    """Two throttles on one Redis namespace (two `serve` processes) see one sliding count."""
    now = [1_000_000.0]
    policy = FailurePolicy(subject=Limit(3, 60), address=Limit(100, 60))
    first, second = (FailureThrottle("client_auth", policy, lambda: now[0], REDIS_URL, redis_namespace)
                     for _ in range(2))
    first.failed(("client", "c1"), "10.0.0.1")
    now[0] += 10
    second.failed(("client", "c1"), "10.0.0.1")
    now[0] += 10
    assert first.failed(("client", "c1"), "10.0.0.1") == [("client", "c1"), ("client", "c1", "address", "10.0.0.1")]
    now[0] += 5
    with pytest.raises(Throttled) as err:
        second.check(("client", "c1"), "10.0.0.2")
    assert err.value.retry_after == 35  # the first failure (25 s ago) is 60 s old in 35 s
    with pytest.raises(Throttled):
        second.check(("client", "c1"), "10.0.0.3")  # any address: the subject is locked
    now[0] += 35
    second.check(("client", "c1"), "10.0.0.2")


def sliding_throttle(store: str, namespace: str, now: list, limit: Limit | None = None) -> FailureThrottle:
    """A client secrets' throttle in `store` ("memory": this process; "redis": shared) on the clock
    `now[0]`, `limit` (3 per 60 s) per client and pair."""
    limit = limit or Limit(3, 60)
    return FailureThrottle("client_auth", FailurePolicy(subject=limit, address=Limit(10**6, limit.seconds)),
                           lambda: now[0], REDIS_URL if store == "redis" else "", namespace)


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_an_attempt_is_counted_as_it_is_admitted_and_withdrawn_when_it_succeeds(store, redis_namespace):
    """`attempt` (console sign-ins): admitted attempts are failures until withdrawn, so attempts in
    flight together never pass the limit; refused ones count nothing, and their Retry-After is the
    sliding count's. With Redis, two throttles (two processes) share it."""
    now = [1_000_000.0]
    first = sliding_throttle(store, redis_namespace, now)
    second = first if store == "memory" else sliding_throttle(store, redis_namespace, now)
    account, pair = ("account", "a"), ("account", "a", "address", "10.0.0.1")
    right = first.attempt(account, "10.0.0.1")           # in flight at 0 s ...
    now[0] += 10
    assert second.attempt(account, "10.0.0.1").locked == []
    now[0] += 10
    held = first.attempt(account, "10.0.0.1")
    assert held.locked == [account, pair]                # the third in flight locks it
    now[0] += 5
    with pytest.raises(Throttled) as err:
        second.attempt(account, "10.0.0.2")
    assert err.value.retry_after == 35                   # the first (25 s ago) is 60 s old in 35 s
    first.withdraw(right)                                # ... and was the right password: no failure
    assert second.attempt(account, "10.0.0.2").locked == [account]
    with pytest.raises(Throttled) as err:
        first.check(account, "10.0.0.3")
    assert err.value.retry_after == 45                   # now the second failure, at 10 s, is the oldest
    first.withdraw(right)                                # withdrawn twice: the second time, nothing
    with pytest.raises(Throttled):
        first.attempt(account, "10.0.0.3")
    now[0] += 45
    assert first.attempt(account, "10.0.0.3").locked == [account]  # the failure at 10 s left the window


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_failures_across_a_window_boundary_count_together_and_the_lock_lasts_a_window(store, redis_namespace):
    """Counted per fixed window aligned to the clock, 2 failures just before a boundary and 3 just
    after were all checked (twice the limit within seconds), and a lock taken 1 s before a boundary
    ended at it. Now: the limit in any 60 s, locked until the oldest counted failure is 60 s old."""
    boundary = 1_000_020.0  # a multiple of 60: where a fixed window ended
    now = [boundary - 5]
    throttle = sliding_throttle(store, redis_namespace, now)
    client, pair = ("client", "c1"), ("client", "c1", "address", "10.0.0.1")
    assert throttle.failed(client, "10.0.0.1") == []        # at -5
    now[0] = boundary - 2
    assert throttle.failed(client, "10.0.0.1") == []        # at -2
    now[0] = boundary + 2
    throttle.check(client, "10.0.0.1")                      # past the boundary: the third is checked ...
    assert throttle.failed(client, "10.0.0.1") == [client, pair]  # ... and locks (audited once)
    with pytest.raises(Throttled) as err:                   # ... a fourth is not, from any address
        throttle.check(client, "10.0.0.9")
    assert err.value.retry_after == 53  # the failure at -5 is 60 s old at +55
    now[0] = boundary + 54.5
    with pytest.raises(Throttled) as err:
        throttle.check(client, "10.0.0.1")
    assert err.value.retry_after == 1   # whole seconds, rounded up: never "0"
    now[0] = boundary + 55
    throttle.check(client, "10.0.0.1")                      # the oldest has left the window: checked again
    # The window slides: the failures at -2 and +2 still count, so one more locks again, until -2 is 60 s old.
    assert throttle.failed(client, "10.0.0.1") == [client, pair]
    with pytest.raises(Throttled) as err:
        throttle.check(client, "10.0.0.1")
    assert err.value.retry_after == 3
    now[0] = boundary + 58
    throttle.check(client, "10.0.0.1")


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_a_steady_guesser_gets_at_most_the_limit_in_any_window(store, redis_namespace):
    """A guesser trying every 0.7 s for 5 windows, failing each time it is let in: in any 60 s at
    most 3 failures are checked, and each refusal's Retry-After is when the next one is let in."""
    limit = Limit(3, 60)
    now = [1_000_000.0]
    throttle = sliding_throttle(store, redis_namespace, now, limit)
    checked, refusals = [], []
    for n in range(int(5 * limit.seconds / 0.7)):
        now[0] = 1_000_000.0 + n * 0.7
        try:
            throttle.check(("client", "c1"), "10.0.0.1")
        except Throttled as exc:
            refusals.append((now[0], exc.retry_after))
            continue
        throttle.failed(("client", "c1"), "10.0.0.1")
        checked.append(now[0])
    assert all(sum(t <= u < t + limit.seconds for u in checked) <= limit.count for t in checked)
    assert len(checked) >= 5 * limit.count - 1 and refusals  # not stricter than the limit either
    last = now[0]
    for at, wait in refusals:  # let in again within the last second Retry-After names, not before
        if at + wait + 0.7 > last:
            continue  # the attempts ended first
        let_in = min(t for t in checked if t > at)
        assert at + wait - 1 < let_in < at + wait + 0.7, (at, wait, let_in)


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_failures_at_the_same_instant_each_count(store, redis_namespace):
    """Two failures counted at the same clock reading (two processes, one microsecond) are two."""
    now = [1_000_000.0]
    throttle = sliding_throttle(store, redis_namespace, now, Limit(2, 60))
    assert throttle.failed(("client", "c1"), "10.0.0.1") == []
    assert ("client", "c1") in throttle.failed(("client", "c1"), "10.0.0.2")
    with pytest.raises(Throttled) as err:
        throttle.check(("client", "c1"), "10.0.0.3")
    assert err.value.retry_after == 60


@pytest.mark.parametrize("store", ["memory", "redis"])
@pytest.mark.gen_test
async def test_wrong_secrets_straddling_a_window_boundary_are_refused_past_the_limit(api, world, runtime,
                                                                                   redis_namespace, store):
    """Over HTTP: 9 wrong secrets just before what was a fixed window's boundary and 1 just after use
    up the limit (10 per 300 s); the 11th is refused with a Retry-After that runs until the first of
    them is 300 s old (it said 1 or so: the time left in the window), and it holds that long."""
    if store == "redis":
        use_redis(runtime, redis_namespace)
    limit = configured(runtime).subject
    trust_local_proxy(runtime)
    app, clock = world.app, runtime.clock
    just_before_a_boundary(clock, limit.seconds, lead=5)
    first = clock.time()
    assert (await client_token(api, app.client_id, "wrong-0", ATTACKER))[0] == 401
    oldest = (first, clock.time())  # when the oldest counted failure was made
    for n in range(1, limit.count - 1):
        assert (await client_token(api, app.client_id, f"wrong-{n}", ATTACKER))[0] == 401
    clock.advance(10)  # past the boundary, where fixed windows counted afresh
    assert (await client_token(api, app.client_id, "wrong-last", "192.0.2.77"))[0] == 401
    before = clock.time()
    status, headers, body = await client_token(api, app.client_id, "wrong-past-the-limit", "192.0.2.78")
    refused = (before, clock.time())
    assert status == 429 and body["error"] == "too_many_attempts", body
    wait = int(headers["Retry-After"])
    assert wait in expected_waits(oldest, refused, limit.seconds), (wait, oldest, refused)
    assert wait > limit.seconds - 60 and f"retry after {wait} seconds" in body["error_description"]
    # Still locked a minute before that, from any address; the right secret is answered throughout.
    clock.advance(wait - 60)
    assert (await client_token(api, app.client_id, "wrong-later", ATTACKER))[0] == 429
    assert (await client_token(api, app.client_id, world.secret, ATTACKER))[0] == 200
    # Once the oldest counted failure is a window old (Retry-After, counted from the refusal), checked again.
    clock.advance(refused[1] + wait - clock.time())
    assert (await client_token(api, app.client_id, "wrong-again", ATTACKER))[0] == 401


@pytest.mark.gen_test
async def test_failure_counts_unreachable_are_a_503_and_the_right_secret_still_works(api, world, runtime):
    """Redis unreachable: a wrong secret cannot be counted (nor checked against its counts), so it
    gets 503 + Retry-After, never a 401 that would let guessing go uncounted; the right secret never
    asks the throttle, so it is answered."""
    from ratelimit.failures import build_failure_throttle
    settings = runtime.settings.replace(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    runtime.client_auth_throttle = build_failure_throttle(settings, "client_auth", runtime.failure_policy(),
                                                          runtime.clock.time, runtime.hasher)
    status, headers, body = await client_token(api, world.app.client_id, "wrong", ATTACKER)
    assert status == 503 and int(headers["Retry-After"]) >= 1, (status, body)
    assert (await client_token(api, world.app.client_id, world.secret, ATTACKER))[0] == 200


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
    allowed = configured(runtime).subject.count
    trust_local_proxy(runtime)  # the new host reaches us through a trusted proxy (X-Forwarded-For)
    app = world.app
    statuses = [(await client_token(api, app.client_id, f"spray-{n}", ATTACKER))[0] for n in range(50)]
    assert statuses[:allowed] == [401] * allowed and set(statuses[allowed:]) == {429}
    status, _, body = await client_token(api, app.client_id, world.secret, "198.51.100.200")
    assert status == 200 and body["token_type"] == "Bearer", body


@pytest.mark.gen_test
async def test_an_address_that_once_succeeded_is_throttled_like_any_other(api, world, runtime, redis_namespace):
    """The open door we measured: 200 wrong secrets from an address that once succeeded all got 401
    and were never throttled. Its failures count like anyone's."""
    use_redis(runtime, redis_namespace)
    allowed = configured(runtime).subject.count
    trust_local_proxy(runtime)
    app = world.app
    assert (await client_token(api, app.client_id, world.secret, LEGIT))[0] == 200
    statuses = [(await client_token(api, app.client_id, f"wrong-{n}", LEGIT))[0] for n in range(allowed + 2)]
    assert statuses == [401] * allowed + [429] * 2


def token_at(port: int, secret: str, client_id: str, conn=None) -> tuple[int, dict, dict]:
    """POST /v1/oauth/token (client_credentials) to a `serve` on `port`, on `conn` or a new connection."""
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.request("POST", "/v1/oauth/token", json.dumps({
            "grant_type": "client_credentials", "client_id": client_id, "client_secret": secret}),
            {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, dict(response.headers), json.loads(response.read())
    finally:
        if own:
            conn.close()


@pytest.mark.slow
def test_wrong_secrets_are_throttled_across_serve_processes(settings, world, tmp_path, redis_namespace):
    """Real `svc-auth serve` processes on one Redis share one sliding count. Wrong secrets at one
    serve (its clock 150 s before what was a fixed window's boundary) and one more at a `serve
    --processes 2` (its clock 200 s ahead: past that boundary, where a fixed window counted afresh)
    use up the limit: both of its workers then refuse the client (429), with a Retry-After that
    runs until the first wrong secret is a window old, and both serves answer the right secret."""
    allowed, window = settings.auth_failure_limit
    ahead = 200  # the second serve's clock runs this much ahead of the first's
    started = time.time()
    behind = (started // window + 1) * window - 150 - started  # the first's offset: 150 s before a boundary
    ports = {"before": free_port(), "after": free_port()}
    procs = []
    try:
        for name, offset, processes in (("before", behind, "1"), ("after", behind + ahead, "2")):
            env = settings_env(settings, SVC_REDIS_URL=REDIS_URL, SVC_REDIS_NAMESPACE=redis_namespace,
                               SVC_CLOCK_OFFSET=offset)
            log = tmp_path / f"serve-{name}.log"
            procs.append(start_process(["serve", "--port", str(ports[name]), "--processes", processes], env,
                                       ports[name], log_path=log))
            wait_until_listening(log, processes=int(processes))
        client_id = world.app.client_id

        def serve_clock(name: str, real: float) -> float:
            return real + behind + (ahead if name == "after" else 0)

        def wrong_secrets_then_refused(client_id: str) -> list[tuple]:
            """allowed - 1 wrong secrets at the first serve, 1 at the second; then wrong secrets on three
            connections at once to the second (its balancer gives each worker some) until both of its
            workers have refused one. Returns (status, Retry-After, real time before, after) of each."""
            first = time.time()
            assert token_at(ports["before"], "wrong-0", client_id)[0] == 401
            oldest = (serve_clock("before", first), serve_clock("before", time.time()))
            assert [token_at(ports["before"], f"wrong-{n}", client_id)[0] for n in range(1, allowed - 1)] \
                == [401] * (allowed - 2)
            assert token_at(ports["after"], "wrong-last", client_id)[0] == 401
            metrics = Path(settings.var_dir) / "metrics" / f"serve-{ports['after']}"
            seen = requests_per_process(metrics, "/v1/oauth/token", "429")
            refusals = []
            for _ in range(50):
                connections = [http.client.HTTPConnection("127.0.0.1", ports["after"], timeout=20) for _ in range(3)]
                try:
                    for conn in connections:
                        conn.connect()
                    for conn in connections:
                        before = time.time()
                        status, headers, body = token_at(ports["after"], "wrong-past-the-limit", client_id, conn)
                        refused = (serve_clock("after", before), serve_clock("after", time.time()))
                        assert status == 429 and body["error"] == "too_many_attempts", (status, body)
                        wait = int(headers["Retry-After"])
                        assert wait in expected_waits(oldest, refused, window), (wait, oldest, refused)
                        refusals.append(wait)
                finally:
                    for conn in connections:
                        conn.close()
                now = requests_per_process(metrics, "/v1/oauth/token", "429")
                if sum(1 for pid, count in now.items() if count > seen.get(pid, 0)) == 2:
                    return refusals
            raise AssertionError(f"one worker answered every refusal: {now}")

        refusals = wrong_secrets_then_refused(client_id)
        # Counted per fixed window, the second serve's clock was in a new window: 401, not 429. Now
        # the lock runs until the first wrong secret (about 200 s earlier on its clock) is 300 s old.
        assert all(wait <= window - ahead for wait in refusals)
        assert token_at(ports["before"], world.secret, client_id)[0] == 200
        assert token_at(ports["after"], world.secret, client_id)[0] == 200
        # A client_id that does not exist is counted across the processes just the same (no oracle).
        wrong_secrets_then_refused("cli_" + "0" * 24)
    finally:
        for proc in procs:
            stop_process(proc)


# --- No existence oracle (issue 28, item 7) ---------------------------------------------------------

def raw_basic(client_id: str, secret: str) -> str:
    """A Basic header with these exact characters (`basic_auth` %-encodes them first)."""
    import base64
    return "Basic " + base64.b64encode(f"{client_id}:{secret}".encode()).decode()


PER_REQUEST_HEADERS = frozenset({"date", "x-request-id", "server"})


def answer(status, headers, body) -> tuple:
    """What a client sees of an answer, without what differs on every request anyway."""
    shown = sorted((k.lower(), v) for k, v in headers.get_all() if k.lower() not in PER_REQUEST_HEADERS)
    return status, shown, body


def without_countdown(one: tuple, other: tuple) -> tuple:
    """`other` with `one`'s Retry-After (and the seconds in its description): the countdown moves
    with the clock between two requests, by at most a second here."""
    import re
    status, headers, body = other
    mine = dict(one[1]).get("retry-after")
    theirs = dict(headers).get("retry-after")
    if mine is None or theirs is None:
        return other
    assert abs(int(mine) - int(theirs)) <= 1
    headers = [(k, mine if k == "retry-after" else v) for k, v in headers]
    body = {k: re.sub(r"after \d+ seconds", f"after {mine} seconds", v) for k, v in body.items()}
    return status, headers, body


async def one_wrong(api, client_id, secret, address, basic: bool) -> tuple:
    if basic:
        return answer(*await api.call(
            "POST", "/v1/oauth/token", body="grant_type=client_credentials",
            headers={"Content-Type": "application/x-www-form-urlencoded", **via(address),
                     "Authorization": basic_auth(client_id, secret)}))
    return answer(*await client_token(api, client_id, secret, address))


@pytest.mark.parametrize("store", ["memory", "redis"])
@pytest.mark.parametrize("basic", [False, True], ids=["body", "basic"])
@pytest.mark.gen_test
async def test_an_unknown_and_a_known_client_id_get_the_same_answers(api, world, runtime, redis_namespace,
                                                                      store, basic):
    """The oracle we measured: 40 wrong secrets for an unknown client_id got 401 x 40, for a known
    one 401 x 8 then 429 x 32. Both are now counted: the same statuses, bodies and headers."""
    if store == "redis":
        use_redis(runtime, redis_namespace)
    allowed = configured(runtime).subject.count
    trust_local_proxy(runtime)
    unknown = "cli_" + "7" * 24  # shaped like a real one
    known, strange = [], []
    for n in range(40):  # in turns, so that both see the same clock
        known.append(await one_wrong(api, world.app.client_id, f"wrong-{n}", "198.51.100.1", basic))
        strange.append(await one_wrong(api, unknown, f"wrong-{n}", "198.51.100.2", basic))
    assert [a[0] for a in known] == [401] * allowed + [429] * (40 - allowed)
    assert [without_countdown(k, u) for k, u in zip(known, strange)] == known
    # Each client is locked on its own: its owner's right secret still works, from anywhere.
    assert (await client_token(api, world.app.client_id, world.secret, "192.0.2.9"))[0] == 200
    locks = {e.subject for e in AuditEvent.select().where(AuditEvent.action == "auth.lockout")}
    assert locks == {f"client:{world.app.client_id}", f"client:{unknown}"}


@pytest.mark.gen_test
async def test_a_client_id_is_normalized_before_it_is_counted_and_junk_is_refused(api, world, runtime):
    """A %-encoded client_id in Basic (RFC 6749 2.3.1) is the same client_id as in the body, so it
    counts on the same counter; what cannot be a client_id is refused clearly, before any lookup."""
    allowed = configured(runtime).subject.count
    trust_local_proxy(runtime)
    client_id = world.app.client_id
    encoded = "".join(f"%{ord(c):02X}" for c in client_id)
    for n in range(allowed // 2):
        assert (await client_token(api, client_id, f"wrong-{n}", "198.51.100.3"))[0] == 401
    for n in range(allowed - allowed // 2):
        status, _, body = await api.call("POST", "/v1/oauth/token", body="grant_type=client_credentials", headers={
            "Content-Type": "application/x-www-form-urlencoded", **via("198.51.100.4"),
            "Authorization": raw_basic(encoded, f"wrong-basic-{n}")})
        assert status == 401 and body["error"] == "invalid_client", body
    assert (await client_token(api, client_id, "wrong-x", "198.51.100.5"))[0] == 429  # all on one counter

    junk = {"overlong": "c" * 65, "a space": "cli 1", "non-ASCII": "cl\u00ee_1", "a newline": "cli_1\n",
            "a broken %-encoding": "%C3%28"}
    for what, value in junk.items():
        status, headers, body = await api.call("POST", "/v1/oauth/token", body="grant_type=client_credentials",
                                               headers={"Content-Type": "application/x-www-form-urlencoded",
                                                        **via("198.51.100.6"),
                                                        "Authorization": raw_basic(value, "s")})
        assert status == 401 and body["error"] == "invalid_client", (what, body)
        assert "client_id is malformed" in body["error_description"] and "WWW-Authenticate" in headers, what
        if what == "a broken %-encoding":
            continue  # only Basic credentials are %-encoded; in a JSON body these are plain characters
        status, _, body = await client_token(api, value, "s", "198.51.100.6")
        assert status == 401 and "client_id is malformed" in body["error_description"], (what, body)
    # NUL never reaches client authentication: the body is refused naming the field.
    status, _, body = await client_token(api, "cli_\x001", "s", "198.51.100.6")
    assert status == 400 and body["error"] == "invalid_request" and "client_id" in body["error_description"]
    status, _, body = await api.call("POST", "/v1/oauth/token", body="grant_type=client_credentials", headers={
        "Content-Type": "application/x-www-form-urlencoded", **via("198.51.100.6"),
        "Authorization": raw_basic("cli_%001", "s")})
    assert status == 401 and body["error"] == "invalid_client" and "NUL" in body["error_description"]


def test_failure_counters_stay_bounded_and_hold_no_presented_value(redis_namespace):
    """Every presented client_id is counted, so a spray of distinct ones must not grow memory without
    bound: in memory at most `max_entries` counters live (the least recently failed go first); in
    Redis every key keeps the newest `limit.count` failure times and expires a window after the
    newest. Neither holds the presented value, only a keyed hash."""
    import redis
    from keys.secrets import SecretHasher
    now = [1_000_000.0]
    hasher = SecretHasher(b"k" * 32)
    policy = FailurePolicy(subject=Limit(3, 60), address=Limit(10**6, 60))
    memory = FailureThrottle("client_auth", policy, lambda: now[0], hasher=hasher)
    memory.store.max_entries = 500
    long_id = "x" * 64
    for n in range(2_000):
        memory.failed(("client", f"{long_id}-{n}"), "10.0.0.1")
    assert len(memory.store) <= 500
    # The one being guessed right now keeps its count while the spray goes on.
    for _ in range(3):
        memory.failed(("client", "target"), "10.0.0.2")
        memory.failed(("client", f"{long_id}-again"), "10.0.0.3")
    with pytest.raises(Throttled):
        memory.check(("client", "target"), "10.0.0.4")

    shared = FailureThrottle("client_auth", policy, lambda: now[0], REDIS_URL, redis_namespace, hasher)
    for n in range(20):  # failures counted by processes that checked before the lock: at most 3 kept
        now[0] += 0.25
        shared.failed(("client", long_id), "10.0.0.1")
    client = redis.Redis.from_url(REDIS_URL)
    keys = [k.decode() for k in client.scan_iter(f"{redis_namespace}:*")]
    assert len(keys) == 3 and not any(long_id in k for k in keys)
    assert all(0 < client.ttl(k) <= 61 for k in keys)
    for key in keys:  # a log of the newest failure times (members: a time and a random suffix)
        entries = client.zrange(key, 0, -1, withscores=True)
        kept = 20 if ":a:" in key else 3  # the address's limit is 10**6
        assert [score for _, score in entries] == [now[0] - 0.25 * n for n in reversed(range(kept))], key
        assert not any(long_id.encode() in member for member, _ in entries)
