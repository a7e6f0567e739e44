"""The FHIR API's limits over HTTP against real `svc-auth serve` processes: per application and
clinic and per access token (in memory, and in Redis shared by two processes), the per-app
override set with `apps update`, the limiter's store down, and the cap on proxied requests in
progress to one clinic's EHR."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from helpers.environment import REDIS_URL
from helpers.fhir_api import Fhir, outcome
from helpers.fhir_ehr import cli
from helpers.processes import free_port, settings_env, start_process, stop_process, wait_until
from helpers.tokens import mint_platform_token
from fhir_api.admission import EHR_BUSY_RETRY_AFTER
from lifecycle.applications import install_application, register_application, set_fhir_rate_limits
from lifecycle.organizations import create_organization
from lifecycle.users import create_user
from ratelimit import build_rate_limiter

DAY = 86400  # windows of a day: a test cannot straddle two


def serve(settings, tmp_path, issuer: str, port: int, **env):
    """A `svc-auth serve` on `port` whose tokens are `issuer`'s (several processes share one)."""
    environment = settings_env(settings, SVC_ISSUER=issuer, SVC_PUBLIC_URL=issuer, **env)
    return start_process(["serve", "--port", str(port)], environment, port, log_path=tmp_path / f"serve-{port}.log")


@pytest.fixture
def serving(settings, tmp_path):
    """Starts serve processes (`start(**env) -> base URL`) and stops them all afterwards."""
    procs, first = [], {}

    def start(**env):
        port = free_port()
        issuer = first.setdefault("issuer", f"http://127.0.0.1:{port}")
        procs.append(serve(settings, tmp_path, issuer, port, **env))
        return issuer, f"http://127.0.0.1:{port}"
    yield start
    for proc in procs:
        stop_process(proc)


def second_app(runtime, org_id: str):
    app, _ = register_application(runtime, "Second App", "https://b.example/main", "https://b.example/launch")
    install_application(app.id, org_id)
    return app


def limited(status, headers, body, limit: int, remaining: int):
    assert status == 200, body
    assert (headers["RateLimit-Limit"], headers["RateLimit-Remaining"]) == (str(limit), str(remaining))
    assert 1 <= int(headers["RateLimit-Reset"]) <= DAY


def throttled(status, headers, body, whose: str):
    assert status == 429 and outcome(body) == "throttled", body
    assert whose in body["issue"][0]["diagnostics"], body
    assert headers["Retry-After"] == headers["RateLimit-Reset"] and headers["RateLimit-Remaining"] == "0"


def check_limits(runtime, world, issuer: str, bases: list[str]):
    """Per token 4, per app and clinic 6 (a day each): the answers of `bases` in turn, which
    share one count when the limiter is shared."""
    org, user = world.org.id, world.physician
    patient = f"/Practitioner/{user.id}"
    token_a = mint_platform_token(runtime, issuer, user, world.app, org)
    calls = iter(range(1000))

    def fhir(token):  # the next process in turn
        return Fhir(bases[next(calls) % len(bases)], org, token)
    # One token: its 4, then refused, though the app has 2 left; a refusal counts nowhere.
    for n in range(4):
        limited(*fhir(token_a).get(patient), limit=4, remaining=3 - n)
    throttled(*fhir(token_a).get(patient), whose="access token")
    throttled(*fhir(token_a).get(patient), whose="access token")
    # Another token of the same app: served until the app's 6 in this clinic are used.
    token_b = mint_platform_token(runtime, issuer, user, world.app, org)
    limited(*fhir(token_b).get(patient), limit=6, remaining=1)
    limited(*fhir(token_b).get(patient), limit=6, remaining=0)
    throttled(*fhir(token_b).get(patient), whose="application in this clinic")
    token_c = mint_platform_token(runtime, issuer, user, world.app, org)
    throttled(*fhir(token_c).get(f"/Patient/nobody"), whose="application in this clinic")
    # A second app in the same clinic is still served; an error after the limiter carries its headers.
    other = second_app(runtime, org)
    token_o = mint_platform_token(runtime, issuer, user, other, org)
    limited(*fhir(token_o).get(patient), limit=4, remaining=3)
    status, headers, body = fhir(token_o).get("/Practitioner/nobody")
    assert status == 404 and outcome(body) == "not-found" and headers["RateLimit-Remaining"] == "2"
    # The public CapabilityStatement is not limited.
    status, headers, _ = fhir(None).get("/metadata")
    assert status == 200 and "RateLimit-Limit" not in headers
    return token_a, token_b


def test_per_app_and_per_token_limits_in_memory(runtime, world, serving, settings):
    issuer, base = serving(SVC_FHIR_RATE_LIMIT=f"6/{DAY}", SVC_FHIR_TOKEN_RATE_LIMIT=f"4/{DAY}")
    token_a, token_b = check_limits(runtime, world, issuer, [base])

    # The operator raises this app's limits: the running process applies them without a restart.
    done = cli(settings, "apps", "update", "--app", world.app.id, "--fhir-rate-limit", "10/day",
               "--fhir-token-rate-limit", f"7/{DAY}", "--json")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert (shown["fhir_rate_limit"], shown["fhir_token_rate_limit"]) == (f"10/{DAY}", f"7/{DAY}")
    fhir_a = Fhir(base, world.org.id, token_a)
    path = f"/Practitioner/{world.physician.id}"
    # Refused (and not counted) until the process drops its cached application, then 7 - 5 for token a.
    status, headers, body = wait_until(lambda: (lambda r: r if r[0] == 200 else None)(fhir_a.get(path)),
                                       what="the new limit applied")
    assert headers["RateLimit-Remaining"] == "2" and headers["RateLimit-Limit"] == "7"  # token: 7 - 5
    limited(*Fhir(base, world.org.id, token_b).get(path), limit=10, remaining=2)  # app: 10 - 8
    # Back to the defaults (what `apps update --fhir-rate-limit default` calls).
    app = set_fhir_rate_limits(runtime, world.app.id, fhir_rate_limit=None, fhir_token_rate_limit=None)
    assert (app.fhir_rate_limit, app.fhir_token_rate_limit) == (None, None)
    wait_until(lambda: fhir_a.get(path)[0] == 429, what="the default limit applied")


@pytest.mark.slow
def test_per_app_and_per_token_limits_shared_by_two_processes_through_redis(runtime, world, serving, redis_namespace):
    env = dict(SVC_FHIR_RATE_LIMIT=f"6/{DAY}", SVC_FHIR_TOKEN_RATE_LIMIT=f"4/{DAY}", SVC_REDIS_URL=REDIS_URL,
               SVC_REDIS_NAMESPACE=redis_namespace)
    issuer, first = serving(**env)
    _, second = serving(**env)
    check_limits(runtime, world, issuer, [first, second])
    import redis
    assert list(redis.Redis.from_url(REDIS_URL).scan_iter(f"{redis_namespace}:ratelimit:fhir_app:*"))


@pytest.mark.slow
def test_quota_leased_by_two_processes_is_never_exceeded_and_fully_usable(runtime, world, serving, redis_namespace):
    """Issue 49: each process leases blocks of a counter's quota from Redis and spends them in
    memory. Over two real serve processes the fleet admits the limit exactly: never one more,
    every unit usable, and each `RateLimit-Remaining` at most the limit less what the answering
    process admitted (`ratelimit.leases`: as of that process's last lease)."""
    import redis
    from concurrent.futures import ThreadPoolExecutor
    limit = 300
    env = dict(SVC_FHIR_RATE_LIMIT=f"100000/{DAY}", SVC_FHIR_TOKEN_RATE_LIMIT=f"{limit}/{DAY}", SVC_REDIS_URL=REDIS_URL,
               SVC_REDIS_NAMESPACE=redis_namespace,
               SVC_FHIR_EHR_CONCURRENCY="64")  # the burst's 8 threads never meet the EHR cap (a 503 after counting)
    issuer, first = serving(**env)
    _, second = serving(**env)
    path = f"/Practitioner/{world.physician.id}"
    client = redis.Redis.from_url(REDIS_URL)

    def shared_count() -> int:
        keys = list(client.scan_iter(f"{redis_namespace}:ratelimit:fhir_token:*"))
        assert len(keys) == 1, keys
        return int(client.get(keys[0]))

    def check_sequential(token):
        admitted, by = 0, {first: 0, second: 0}

        def read(base):
            nonlocal admitted
            status, headers, body = Fhir(base, world.org.id, token).get(path)
            if status == 200:
                admitted += 1
                by[base] += 1
                assert 0 <= int(headers["RateLimit-Remaining"]) <= limit - by[base], (by, headers)
            else:
                throttled(status, headers, body, whose="access token")
            return status
        for _ in range(40):
            assert read(first) == 200
        leased = shared_count()
        assert 40 < leased <= limit  # blocks: Redis counted more than the 40 admitted, in far fewer calls
        while read(second) == 200:  # the second process takes what Redis has left...
            pass
        assert shared_count() == limit and admitted < limit  # ...while the first still holds quota
        while read(first) == 200:  # which it alone spends
            pass
        assert admitted == limit and shared_count() == limit
        assert read(second) == 429 and read(first) == 429
    check_sequential(mint_platform_token(runtime, issuer, world.physician, world.app, world.org.id))
    client.delete(*client.scan_iter(f"{redis_namespace}:ratelimit:fhir_token:*"))

    # At once: 8 threads over both processes, then each process drained in turn.
    token = mint_platform_token(runtime, issuer, world.physician, world.app, world.org.id)
    bases = [first, second] * 4

    def burst(base):
        answers = [Fhir(base, world.org.id, token).get(path) for _ in range(50)]
        statuses = [status for status, _, _ in answers]
        assert set(statuses) <= {200, 429}, [body for status, _, body in answers if status not in (200, 429)]
        return statuses.count(200)
    with ThreadPoolExecutor(len(bases)) as pool:
        admitted = sum(pool.map(burst, bases))
    assert admitted <= limit and shared_count() <= limit
    for base in (first, second):
        while Fhir(base, world.org.id, token).get(path)[0] == 200:
            admitted += 1
    assert admitted == limit and shared_count() == limit
    client.close()


@pytest.mark.slow
def test_a_revocation_reaches_every_process_at_once_through_the_redis_deny_list(runtime, world, serving,
                                                                               redis_namespace):
    """Issue 49: with Redis, each process keeps the deny-list's answers while the database's `denied`
    version stands still (no Redis call per read). A token revoked through one process is refused by
    the very next read in every process."""
    import urllib.request
    from helpers.http import basic_auth
    env = dict(SVC_REDIS_URL=REDIS_URL, SVC_REDIS_NAMESPACE=redis_namespace)
    issuer, first = serving(**env)
    _, second = serving(**env)
    path = f"/Practitioner/{world.physician.id}"
    token = mint_platform_token(runtime, issuer, world.physician, world.app, world.org.id)
    for base in (first, second, first, second):  # each process has read (and kept) "not denied"
        assert Fhir(base, world.org.id, token).get(path)[0] == 200
    request = urllib.request.Request(f"{first}/v1/oauth/revoke", method="POST",
                                     data=f"token={token}".encode(),
                                     headers={"Content-Type": "application/x-www-form-urlencoded",
                                              "Authorization": basic_auth(world.app.client_id, world.secret)})
    assert urllib.request.urlopen(request, timeout=10).status == 200
    for base in (second, first):
        status, headers, _ = Fhir(base, world.org.id, token).get(path)
        assert status == 401 and 'error="invalid_token"' in headers["WWW-Authenticate"]


@pytest.mark.gen_test
async def test_the_limiters_store_down_is_a_503_with_retry_after(api, runtime, world):
    # Only the limiter's store is down (the deny-list and the rest of the process work).
    runtime.rate_limiter = build_rate_limiter(runtime.settings.replace(
        redis_url=f"redis://127.0.0.1:{free_port()}/0"), runtime.clock)
    token = mint_platform_token(runtime, runtime.settings.issuer, world.physician, world.app, world.org.id)
    status, headers, body = await api.call("GET", f"/fhir/r4/{world.org.id}/Practitioner/{world.physician.id}",
                                           headers={"Authorization": f"Bearer {token}"})
    assert status == 503 and outcome(body) == "transient" and "rate limiter" in body["issue"][0]["diagnostics"]
    assert int(headers["Retry-After"]) > 0


@pytest.mark.gen_test
async def test_a_browser_app_reads_its_limits(api, runtime, world):
    origin = "https://b.example"
    app, _ = register_application(runtime, "Browser App", "https://b.example/main", "https://b.example/launch",
                                  None, "paid", ["email"], [origin])
    install_application(app.id, world.org.id)
    token = mint_platform_token(runtime, runtime.settings.issuer, world.physician, app, world.org.id)
    status, headers, _ = await api.call("GET", f"/fhir/r4/{world.org.id}/Practitioner/{world.physician.id}",
                                        headers={"Authorization": f"Bearer {token}", "Origin": origin})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == origin
    exposed = {h.strip() for h in headers["Access-Control-Expose-Headers"].split(",")}
    assert {"Retry-After", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"} <= exposed
    per_token = runtime.settings.fhir_token_rate_limit[0]  # the default, SVC_FHIR_TOKEN_RATE_LIMIT
    assert headers["RateLimit-Limit"] == str(per_token) and headers["RateLimit-Remaining"] == str(per_token - 1)


def test_apps_update_refuses_a_bad_fhir_rate_limit(capsys):
    # argparse refuses before anything is opened: the command's own parser, in this process.
    from cli import build_parser
    for flag in ("--fhir-rate-limit", "--fhir-token-rate-limit"):
        for value, reason in (("10/fortnight", "COUNT/UNIT"), ("0/minute", "1 to"), ("10/0", "1 to 86400"),
                              ("", "COUNT/UNIT")):
            with pytest.raises(SystemExit) as exited:
                build_parser().parse_args(["apps", "update", "--app", "app_x", flag, value])
            assert exited.value.code == 2, value
            error = capsys.readouterr().err
            assert f"argument {flag}" in error and reason in error, error
    args = build_parser().parse_args(["apps", "update", "--app", "app_x", "--fhir-rate-limit", "50/second",
                                      "--fhir-token-rate-limit", "Default"])
    assert (args.fhir_rate_limit.count, args.fhir_rate_limit.seconds, args.fhir_token_rate_limit) == (50, 1, "default")


class HeldEhr:
    """An open FHIR server (no auth) whose reads wait until `release()`: requests in progress at the EHR."""

    def __init__(self):
        self.arrived = threading.Semaphore(0)
        self.go = threading.Event()
        self.count = 0
        held = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                held.count += 1
                held.arrived.release()
                held.go.wait(30)
                resource_type, resource_id = self.path.rsplit("/", 2)[-2:]
                body = json.dumps({"resourceType": resource_type, "id": resource_id}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/fhir+json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_port}/fhir"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.go.set()
        self.server.shutdown()
        self.server.server_close()


def test_requests_in_progress_to_one_clinics_ehr_are_capped(runtime, world, serving):
    ehr = HeldEhr()
    try:
        clinic = create_organization("Held Clinic", "fhir", ehr.base, fhir_auth="none")
        user = create_user(clinic.id, "held@example.com", "Held", "Doc", "hdoc")
        install_application(world.app.id, clinic.id)
        issuer, base = serving(SVC_FHIR_EHR_CONCURRENCY="2")
        fhir = Fhir(base, clinic.id, mint_platform_token(runtime, issuer, user, world.app, clinic.id, scope="openid user/*.r"))
        answers = []
        readers = [threading.Thread(target=lambda n=n: answers.append(fhir.get(f"/Patient/p{n}"))) for n in range(2)]
        for reader in readers:
            reader.start()
        for _ in readers:
            assert ehr.arrived.acquire(timeout=60), "a read did not reach the EHR"
        # Both slots of the clinic are in use: refused at once, and the EHR never sees it.
        status, headers, body = fhir.get("/Patient/p3")
        assert status == 503 and outcome(body) == "transient" and headers["Retry-After"] == str(EHR_BUSY_RETRY_AFTER), body
        assert "RateLimit-Limit" in headers  # counted: it passed the rate limit
        assert ehr.count == 2
        # Another clinic on the same process is served meanwhile.
        sandbox = Fhir(base, world.org.id, mint_platform_token(runtime, issuer, world.physician, world.app, world.org.id))
        assert sandbox.get(f"/Practitioner/{world.physician.id}")[0] == 200
        ehr.go.set()
        for reader in readers:
            reader.join(60)
        assert sorted(a[0] for a in answers) == [200, 200], answers
        assert fhir.get("/Patient/p4")[0] == 200  # the slots were given back
    finally:
        ehr.close()
