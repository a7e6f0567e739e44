"""Operations over real HTTP: /healthz, /readyz, /metrics, request ids, JSON logs without secrets,
and X-Forwarded-* honoured only from trusted proxies."""
import datetime as dt
import io
import json
import logging
import re
import urllib.parse
import uuid

import pytest
import tornado.httputil

from conf.logging import AccessRecord, JsonFormatter, redact
from ops.readiness import Readiness
from ops.proxy import client_address, external_base_url
from helpers.environment import REDIS_URL
from helpers.http import basic_auth
from helpers.metrics import sample
from helpers.processes import free_port


@pytest.fixture
def json_logs():
    """Every log record of the test, formatted by the service's JSON formatter, as parsed lines."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)

    def lines():
        handler.flush()
        raw = stream.getvalue()
        return raw, [json.loads(line) for line in raw.splitlines() if line.strip()]
    yield lines
    root.removeHandler(handler)
    root.setLevel(old_level)




@pytest.mark.gen_test
async def test_healthz_and_readyz(api, runtime):
    status, _, body = await api.call("GET", "/healthz")
    assert (status, body) == (200, {"status": "ok"})
    status, headers, body = await api.call("GET", "/readyz")
    assert status == 200 and body["status"] == "ready"
    assert body["checks"]["database"]["status"] == "ok"
    assert body["checks"]["redis"]["status"] == "skipped"  # not configured: in-process broker
    assert body["checks"]["object_store"]["status"] == "skipped"
    assert headers["Cache-Control"] == "no-store"


@pytest.mark.gen_test
async def test_an_answer_nobody_may_store_has_no_etag_and_others_keep_theirs(api, runtime, world):
    """`no-store` answers carry no validator (nothing can revalidate what was not kept), so an
    If-None-Match gets the answer itself; a cacheable answer keeps its ETag (its 304:
    tests/test_one_vocabulary.py)."""
    for path in ("/healthz", "/readyz"):
        status, headers, _ = await api.call("GET", path, headers={"If-None-Match": "*"})
        assert status == 200 and headers["Cache-Control"] == "no-store" and "Etag" not in headers, path
    # The FHIR API's answers are no-store too (a CapabilityStatement here; a page of 50 was hashed for
    # a tag nobody could use).
    status, headers, _ = await api.call("GET", f"/fhir/r4/{world.org.id}/metadata", headers={"If-None-Match": "*"})
    assert status == 200 and headers["Cache-Control"] == "no-store" and "Etag" not in headers
    status, headers, _ = await api.call("GET", "/v1/schemas/chart.json")
    assert status == 200 and headers.get("Etag")


@pytest.mark.gen_test
async def test_readyz_checks_redis_when_configured(api, runtime):
    runtime.settings = runtime.settings.replace(redis_url=REDIS_URL)
    status, _, body = await api.call("GET", "/readyz")
    assert status == 200 and body["checks"]["redis"]["status"] == "ok"
    runtime.settings = runtime.settings.replace(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    status, _, body = await api.call("GET", "/readyz")
    assert status == 503 and body["status"] == "unavailable"
    assert body["checks"]["redis"]["status"] == "failed" and body["checks"]["database"]["status"] == "ok"


@pytest.mark.gen_test
async def test_readyz_runs_registered_checks_and_fails_while_draining(api, runtime):
    def broken(rt):
        raise ConnectionError("broker unreachable")
    runtime.readiness.add("test_broker", broken)
    status, _, body = await api.call("GET", "/readyz")
    assert status == 503
    assert body["checks"]["test_broker"] == {"status": "failed", "error": "ConnectionError: broker unreachable",
                                             "ms": body["checks"]["test_broker"]["ms"]}
    assert "test_broker" not in Readiness().checks  # the check belongs to this runtime only
    runtime.draining = True
    status, _, body = await api.call("GET", "/readyz")
    assert status == 503 and body["checks"]["shutdown"]["status"] == "failed"
    assert (await api.call("GET", "/healthz"))[0] == 200


@pytest.mark.gen_test
async def test_request_id_is_echoed_or_generated(api, runtime):
    _, headers, _ = await api.call("GET", "/healthz", headers={"X-Request-Id": "abc-123.def:9"})
    assert headers["X-Request-Id"] == "abc-123.def:9"
    _, headers, _ = await api.call("GET", "/healthz", headers={"X-Request-Id": "bad id\u00e9<script>" * 3})
    assert re.fullmatch(r"[0-9a-f]{32}", headers["X-Request-Id"])
    _, first, _ = await api.call("GET", "/nope")
    _, second, _ = await api.call("GET", "/nope")
    assert first["X-Request-Id"] != second["X-Request-Id"]  # also on error responses


@pytest.mark.gen_test
async def test_metrics_count_requests_by_route_pattern_and_tokens_by_grant(api, flow, world):
    _, _, before = await api.call("GET", "/metrics")
    tokens = await flow.tokens()
    app, secret = world.app, world.secret
    status, _, _ = await api.call("POST", "/v1/oauth/token", {"grant_type": "client_credentials"},
                                  headers={"Authorization": basic_auth(app.client_id, secret)})
    assert status == 200
    await api.call("POST", "/v1/oauth/token", {"grant_type": "client_credentials"},
                   headers={"Authorization": basic_auth(app.client_id, "wrong")})
    await api.call("GET", "/v1/oauth/userinfo", headers={"Authorization": tokens["access_token"]})
    await api.call("GET", "/no/such/path/12345")
    status, headers, after = await api.call("GET", "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")

    def delta(name, **labels):
        return sample(after, name, **labels) - sample(before, name, **labels)
    assert delta("svc_http_requests_total", route="/v1/oauth/token", method="POST", status="200") == 2
    assert delta("svc_http_requests_total", route="/v1/oauth/token", method="POST", status="401") == 1
    assert delta("svc_http_requests_total", route="/v1/oauth/userinfo", method="GET", status="200") == 1
    assert delta("svc_http_requests_total", route="/v1/oauth/authorize", method="GET", status="302") == 1
    assert delta("svc_http_requests_total", route="unmatched", method="GET", status="404") == 1
    assert "/no/such/path" not in after  # raw paths never become labels
    assert delta("svc_http_request_duration_seconds_count", route="/v1/oauth/token", method="POST") == 3
    assert delta("svc_tokens_issued_total", grant="authorization_code") == 1
    assert delta("svc_tokens_issued_total", grant="client_credentials") == 1


@pytest.mark.gen_test
async def test_metrics_hooks_for_rate_limits_jobs_and_queue_depth(api, runtime):
    metrics = runtime.metrics
    _, _, before = await api.call("GET", "/metrics")
    metrics.count_rate_limit_rejection("get_appointments")
    metrics.count_job("build_chart_zip", "failed")
    metrics.add_queue_depth(lambda: {"test-queue": 7})
    metrics.add_queue_depth(lambda: 1 / 0)  # a broken source does not break the scrape
    status, _, after = await api.call("GET", "/metrics")
    assert status == 200
    assert sample(after, "svc_rate_limit_rejections_total", operation="get_appointments") - \
        sample(before, "svc_rate_limit_rejections_total", operation="get_appointments") == 1
    assert sample(after, "svc_jobs_total", actor="build_chart_zip", outcome="failed") - \
        sample(before, "svc_jobs_total", actor="build_chart_zip", outcome="failed") == 1
    assert sample(after, "svc_queue_depth", queue="test-queue") == 7


@pytest.mark.gen_test
async def test_logs_are_json_with_request_ids_and_no_secrets(api, flow, world, json_logs):
    app, secret = world.app, world.secret
    launch_id = await flow.launch()
    status, headers, _ = await flow.authorize(launch_id=launch_id, state="st4te-secret-value")
    code = re.search(r"code=([^&]+)", headers["Location"]).group(1)
    authorize_rid = headers["X-Request-Id"]
    status, _, tokens = await flow.exchange(code)
    assert status == 200
    await flow.exchange(code)  # replay: an error path with the code in the body
    await api.call("GET", "/v1/oauth/userinfo", headers={"Authorization": f"Bearer {tokens['access_token']}"})
    await api.call("POST", "/v1/oauth/introspect", {"token": tokens["access_token"]},
                   headers={"Authorization": basic_auth(app.client_id, secret)})
    await api.call("POST", "/v1/oauth/token", {"grant_type": "client_credentials"},
                   headers={"Authorization": basic_auth(app.client_id, secret)})
    # secrets in a query string too, as a careless client might send them
    await api.call("GET", f"/v1/oauth/authorize?client_id={app.client_id}&code={code}&client_secret={secret}"
                          f"&access_token={tokens['access_token']}")
    raw, lines = json_logs()
    assert lines, "the requests above must have been logged"
    for secret_value in (secret, code, launch_id, tokens["access_token"], tokens["id_token"],
                         world.sandbox_token, "st4te-secret-value"):
        assert secret_value not in raw
    access = [line for line in lines if line["logger"] == "svc_auth.access"]
    assert len(access) >= 8
    for line in access:
        assert re.fullmatch(r"[0-9a-f]{32}", line["request_id"])
        assert {"ts", "level", "message", "method", "route", "status", "duration_ms", "client"} <= set(line)
    authorize = [line for line in access if line["request_id"] == authorize_rid]
    assert len(authorize) == 1 and authorize[0]["status"] == 302
    assert "launch_id=[REDACTED]" in authorize[0]["path"] and f"client_id={app.client_id}" in authorize[0]["path"]


@pytest.mark.gen_test
async def test_a_smart_launch_parameter_never_reaches_the_log(api, flow, world, json_logs):
    """SMART's `launch` names the launch as `launch_id` does: a live one opens the app as its user
    (a public client needs nothing else), so its value is redacted like launch_id's. It was logged in
    clear; here authorize fails on `aud` before the launch is spent, so the logged id was still live."""
    launch_id = await flow.launch()
    status, headers, _ = await flow.authorize(launch_id=None, launch=launch_id, aud="https://elsewhere.example/fhir")
    assert status == 302 and "error=invalid_request" in headers["Location"]
    raw, lines = json_logs()
    authorize = [line for line in lines if line["logger"] == "svc_auth.access" and "/oauth/authorize" in line["path"]]
    assert len(authorize) == 1 and "launch=[REDACTED]" in authorize[0]["path"]
    assert launch_id not in raw


@pytest.mark.gen_test
async def test_one_time_links_in_paths_never_reach_the_log(api, world, runtime, json_logs):
    """A sandbox sign-in link, a console invitation and a partner's invitation link carry their
    secret in the path, which the access log wrote in clear. A sign-in link refused while its
    address is locked (429) is not spent, and a console invitation's page spends nothing: the
    logged link still signed its holder in as the clinician, or set the developer's password."""
    from console.accounts import invite_developer
    from hub.sandbox import create_signin_link
    from ratelimit.failures import build_failure_throttle
    runtime.settings = runtime.settings.replace(auth_address_failure_limit=(1, 300))
    runtime.sandbox_signin_throttle = build_failure_throttle(runtime.settings, "sandbox_signin",
                                                             runtime.failure_policy(), lambda: runtime.clock.time())
    assert (await api.call("GET", "/sandbox/signin/a-wrong-guess"))[0] == 401
    link = urllib.parse.urlsplit(create_signin_link(runtime, world.physician.id)).path
    assert (await api.call("GET", link))[0] == 429
    _, invite_url, _ = invite_developer(runtime, world.app.id, "dev@partner.example")
    invite = urllib.parse.urlsplit(invite_url).path
    assert (await api.call("GET", invite))[0] == 200
    raw, lines = json_logs()
    for secret in (link.rsplit("/", 1)[1], invite.rsplit("/", 1)[1], "a-wrong-guess"):
        assert secret not in raw
    paths = [line["path"] for line in lines if line["logger"] == "svc_auth.access"]
    assert "/sandbox/signin/[REDACTED]" in paths and "/console/invite/[REDACTED]" in paths
    runtime.clock.advance(300)
    assert (await api.call("GET", link))[0] == 302  # the link the log held was live


def test_redact_covers_query_values_json_fields_credentials_and_jwts():
    text = ('GET /cb?code=abc123&state=s1&client_id=app1 {"client_secret": "s3cr3t", "name": "x"} '
            'Authorization: Bearer tok.en.value Basic dXNlcjpwYXNz eyJhbGciOi.eyJzdWIiOiJ4In0.c2ln')
    out = redact(text)
    for secret in ("abc123", "s1", "s3cr3t", "tok.en.value", "dXNlcjpwYXNz", "eyJhbGciOi"):
        assert secret not in out
    assert "client_id=app1" in out and '"name": "x"' in out
    assert redact("unicode=1&barcode=7") == "unicode=1&barcode=7"  # names, not substrings
    # A token request's secrets sent, by mistake, in its URL (the endpoint reads only its body).
    out = redact("POST /v1/oauth/token?code_verifier=v3r1f13r&client_assertion=n0tajwt&grant_type=x")
    assert "v3r1f13r" not in out and "n0tajwt" not in out and "grant_type=x" in out


def test_json_lines_redact_a_secret_in_any_field_and_keep_the_rest():
    """The formatter scans a line's text once and redacts field by field only when something may
    be a secret; whichever field holds it, it never reaches the line, and the rest stays as is."""
    formatter = JsonFormatter()
    clean = logging.LogRecord("svc_auth.access", logging.INFO, __file__, 1, "%s %s %d", ("POST", "/v1/oauth/token", 200), None)
    clean.route, clean.status = "/v1/oauth/token", 200
    line = json.loads(formatter.format(clean))
    assert line["message"] == "POST /v1/oauth/token 200" and line["route"] == "/v1/oauth/token" and line["status"] == 200
    assert line["ts"] == dt.datetime.fromtimestamp(clean.created, dt.timezone.utc).isoformat(timespec="milliseconds")
    for field in ("path", "note", "client"):
        record = logging.LogRecord("svc_auth.access", logging.INFO, __file__, 1, "GET %s", ("/cb",), None)
        record.route = "/v1/oauth/authorize"
        setattr(record, field, "/cb?code=abc123&client_id=app1 Bearer tok.en.value")
        line = json.loads(formatter.format(record))
        assert line[field] == "/cb?code=[REDACTED]&client_id=app1 Bearer [REDACTED]"
        assert line["route"] == "/v1/oauth/authorize" and line["message"] == "GET /cb"
    secret_message = logging.LogRecord("x", logging.INFO, __file__, 1, "token=%s", ("s3cr3t",), None)
    assert "s3cr3t" not in formatter.format(secret_message)


def test_an_access_record_is_written_as_the_general_path_writes_its_fields():
    """The access line's direct path (`AccessRecord`) gives the same bytes as the general walk
    over a record's attributes, and leaves any line it cannot vouch for to that walk."""
    formatter = JsonFormatter()

    def both(level=logging.INFO, rid="a" * 32, method="GET", route="/healthz", path="/healthz", status=200,
             duration=0.12, client="127.0.0.1", added=None):
        fields = {"request_id": rid, "method": method, "route": route, "path": path, "status": status,
                  "duration_ms": duration, "client": client}
        access = AccessRecord("svc_auth.access", level, **fields)
        plain = logging.LogRecord("svc_auth.access", level, __file__, 0, "%s %s %d", (method, route, status), None)
        plain.__dict__.update(fields, **(added or {}))
        plain.created = access.created
        access.__dict__.update(added or {})
        return formatter.format(access), formatter.format(plain)

    cases = [{}, {"level": logging.ERROR, "status": 503}, {"path": "/x/\\ \u00e9\u2603\n\t"}, {"path": '/x?a="b"'},
             {"path": "/cb?code=abc123&client_id=app1"}, {"method": "eyJabcd.efghij.klm"}, {"rid": ""},
             {"client": "2001:db8::1"}, {"duration": 1234.5}, {"added": {"note": "a filter's"}}]
    for case in cases:
        direct, general = both(**case)
        assert direct == general, case
        assert json.loads(direct)["status"] == case.get("status", 200)
    assert "abc123" not in both(path="/cb?code=abc123")[0]
    assert json.loads(both(added={"note": "x"})[0])["note"] == "x"


def _request(peer: str, **headers) -> tornado.httputil.HTTPServerRequest:
    class Connection:
        context = type("Context", (), {"remote_ip": peer, "protocol": "http"})()

        def set_close_callback(self, callback):
            pass
    return tornado.httputil.HTTPServerRequest(
        method="GET", uri="/v1/x", headers=tornado.httputil.HTTPHeaders(headers),
        host="10.0.0.5:8888", connection=Connection())


def test_forwarded_headers_only_from_trusted_proxies(settings):
    trusted = settings.replace(trusted_proxies="127.0.0.1/32,10.0.0.0/8")
    forwarded = {"X-Forwarded-For": "203.0.113.9, 10.1.2.3", "X-Forwarded-Proto": "https",
                 "X-Forwarded-Host": "auth.example.com"}
    proxied = _request("127.0.0.1", **forwarded)
    assert client_address(proxied, trusted) == "203.0.113.9"  # walks past the trusted 10.x hop
    assert external_base_url(proxied, trusted) == "https://auth.example.com"
    assert client_address(proxied, settings) == "127.0.0.1"  # no trusted proxies configured
    assert external_base_url(proxied, settings) == "http://10.0.0.5:8888"
    direct = _request("198.51.100.7", **forwarded)  # a client forging the headers
    assert client_address(direct, trusted) == "198.51.100.7"
    assert external_base_url(direct, trusted) == "http://10.0.0.5:8888"
    spoofed = _request("127.0.0.1", **{"X-Forwarded-For": "1.2.3.4, 203.0.113.9"})
    assert client_address(spoofed, trusted) == "203.0.113.9"  # the client-supplied 1.2.3.4 is not trusted
    assert client_address(_request("10.0.0.2", **{"X-Forwarded-For": "garbage"}), trusted) == "10.0.0.2"
    assert client_address(_request("10.0.0.2"), trusted) == "10.0.0.2"  # no header: the proxy itself
    assert client_address(_request("::ffff:10.0.0.2", **{"X-Forwarded-For": "203.0.113.9"}), trusted) == "203.0.113.9"
    assert external_base_url(_request("127.0.0.1", **{"X-Forwarded-Host": "evil.example/x"}), trusted) \
        == "http://10.0.0.5:8888"


@pytest.mark.gen_test
async def test_access_log_client_address_honours_trusted_proxies(api, runtime, json_logs):
    headers = {"X-Forwarded-For": "203.0.113.9"}
    await api.call("GET", "/healthz", headers=dict(headers, **{"X-Request-Id": "untrusted-1"}))
    runtime.settings = runtime.settings.replace(trusted_proxies="127.0.0.1/32")
    await api.call("GET", "/healthz", headers=dict(headers, **{"X-Request-Id": "trusted-1"}))
    _, lines = json_logs()
    by_id = {line["request_id"]: line for line in lines if line["logger"] == "svc_auth.access"}
    assert by_id["untrusted-1"]["client"] == "127.0.0.1"
    assert by_id["trusted-1"]["client"] == "203.0.113.9"


@pytest.mark.gen_test
async def test_warns_once_when_the_proxy_reports_another_origin_than_the_issuer(api, runtime, json_logs):
    runtime.settings = runtime.settings.replace(trusted_proxies="127.0.0.1/32")
    good = {"X-Forwarded-Proto": "http", "X-Forwarded-Host": "127.0.0.1:8888"}  # = SVC_ISSUER
    host = f"auth-{uuid.uuid4().hex[:8]}.example"  # the warning is once per process and origin
    bad = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": host}
    for headers in (good, bad, bad):
        assert (await api.call("GET", "/healthz", headers=headers))[0] == 200
    _, lines = json_logs()
    warnings = [line for line in lines if line["level"] == "WARNING"]
    assert [w["external_base_url"] for w in warnings] == [f"https://{host}"]
    assert "SVC_ISSUER is http://127.0.0.1:8888" in warnings[0]["message"]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # the probes, not the database, are under test
def test_readyz_probes_reuse_one_redis_connection_and_share_reports(settings, tmp_path):
    """/readyz is unauthenticated: every probe used to build a new Redis client (a new connection)
    and, with S3, a new boto3 client, on the shared pool. A real `serve` on a Redis of its own
    (its `total_connections_received` counts only this server's connections): 50 probes, ten at a
    time, now open no Redis connection beyond the one the check keeps (before: one each). A Redis
    that is down still answers 503 promptly."""
    import concurrent.futures
    import redis as redis_client
    import urllib.error
    import urllib.request
    from bench.instances import LocalRedis
    from helpers.processes import settings_env, start_process, stop_process, wait_until
    server = LocalRedis()
    server.start()
    proc = None
    try:
        settings = settings.replace(redis_url=server.url)
        port = free_port()
        proc = start_process(["serve", "--port", str(port)], settings_env(settings), port,
                             log_path=tmp_path / "serve.log")

        def readyz() -> tuple[int, dict]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=10) as response:
                    return response.status, json.loads(response.read())
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read())

        status, body = readyz()  # the check's client connects once
        assert status == 200 and body["checks"]["redis"]["status"] == "ok", body
        admin = redis_client.Redis.from_url(server.url)
        # Whatever else the process connects at its start (change feed, rate limits) is settled first.
        wait_until(lambda: readyz()[0] == 200 and admin.info("clients")["connected_clients"] >= 2, timeout=20,
                   what="serve's own Redis connections")
        before = admin.info("stats")["total_connections_received"]
        with concurrent.futures.ThreadPoolExecutor(10) as pool:
            answers = list(pool.map(lambda _: readyz(), range(50)))
        assert all(status == 200 for status, _ in answers), answers
        opened = admin.info("stats")["total_connections_received"] - before  # admin reuses its one connection
        assert opened <= 3, f"50 /readyz opened {opened} Redis connections"
        admin.close()
        server.stop()  # down: a 503 naming it, within the check's 1 s timeout (and the 1 s a report is reused)
        status, body = wait_until(lambda: (answer := readyz())[0] == 503 and answer, timeout=10, what="a 503")
        assert body["checks"]["redis"]["status"] == "failed", body
    finally:
        if proc is not None:
            stop_process(proc)
        server.destroy()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # the probes, not the database, are under test
def test_readyz_probes_reuse_one_s3_client(settings, s3_endpoint, tmp_path):
    """With S3, every probe used to build a new boto3 client (~10 ms of CPU; its own connection). A
    real `serve` reaches moto's S3 through a counting proxy: 50 probes, ten at a time, now open no
    connection beyond the one the check's client keeps (before: one each)."""
    import concurrent.futures
    import urllib.request
    import boto3
    from helpers.processes import settings_env, start_process, stop_process
    from helpers.s3 import AWS, HoldingProxy
    bucket = f"readyz-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket=bucket)
    proxy = HoldingProxy(int(s3_endpoint.rsplit(":", 1)[1]))  # forwards everything; counts connections
    proc = None
    try:
        settings = settings.replace(s3_bucket=bucket, s3_endpoint_url=proxy.url)
        port = free_port()
        proc = start_process(["serve", "--port", str(port)], settings_env(settings, **AWS), port,
                             log_path=tmp_path / "serve.log")

        def readyz() -> dict:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=10) as response:
                assert response.status == 200
                return json.loads(response.read())

        assert readyz()["checks"]["object_store"]["status"] == "ok"  # the check's client connects once
        before = len(proxy.sockets) // 2
        with concurrent.futures.ThreadPoolExecutor(10) as pool:
            answers = list(pool.map(lambda _: readyz(), range(50)))
        assert all(body["checks"]["object_store"]["status"] == "ok" for body in answers)
        opened = len(proxy.sockets) // 2 - before
        assert opened <= 3, f"50 /readyz opened {opened} connections to S3"
    finally:
        if proc is not None:
            stop_process(proc)
        proxy.close()
