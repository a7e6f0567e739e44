"""Production shape: Debian's nginx, with the shipped site config (`deploy/nginx/svc-auth.conf`), in
front of two `svc-auth serve` processes on PostgreSQL with SVC_REDIS_URL set.

`proxied` starts the whole stack for a test; `proxied.call()` talks to nginx. A test of another part
through the proxy needs only `proxied` and `world` (for example the REST rate limit shared by both
processes: take a client-credentials token with `proxied.client_credentials_token()`, call a limited
operation until 429 and check the count over both upstreams, `proxied.upstreams_that_served()`).
"""
import http.client
import json
import os
import re
import subprocess
import time
import urllib.parse
from pathlib import Path

import pytest
from jose import jwt

from helpers.environment import BACKENDS
from helpers.http import basic_auth
from helpers.nginx_site import NGINX, SITE, nginx_conf, runnable_site
from helpers.processes import free_port, settings_env, start_process, stop_process, wait_for_port
PROXY_ADDRESS = "127.0.0.2"  # nginx connects upstream from here, so the test client (127.0.0.1) is not a proxy

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif("postgresql" not in BACKENDS, reason="the proxied stack runs on PostgreSQL"),
    pytest.mark.skipif(not os.path.exists(NGINX), reason="needs Debian's nginx (make system-deps)"),
    pytest.mark.parametrize("backend", ["postgresql"], indirect=True),
    # The service as deployed: its public address is nginx's, nginx is the trusted proxy; Redis is
    # shared with other test runs: this test's keys (rate limits, queues) under its own namespace.
    pytest.mark.svc_settings(public_port="nginx_port", redis=True, trusted_proxies=f"{PROXY_ADDRESS}/32"),
]


def nginx_config(tmp: Path, port: int, upstream_ports: list[int]) -> Path:
    """The shipped site config with these upstreams, in a non-root nginx.conf: its proxying server
    in plain HTTP on a loopback port (the issuer here is http://127.0.0.1:PORT), so X-Forwarded-Host
    carries that port; its default and port-80 servers on ports of their own (tests/test_nginx_site.py
    checks them, and TLS, on the file as shipped)."""
    ports = {"default_http": free_port(), "default_https": free_port(), "http": free_port(), "https": port}
    site = runnable_site(tmp, ports, upstream_ports, tls=False)
    site, count = re.subn(r"(?m)^(\s*)proxy_set_header X-Forwarded-Host \$host;",
                          r"\1proxy_set_header X-Forwarded-Host $host:$server_port;", site)
    assert count == 1, "the proxied X-Forwarded-Host of deploy/nginx/svc-auth.conf changed"
    site, count = re.subn(r"(?m)^(\s*)proxy_buffer_size 8k;", rf"\g<0>\n\1proxy_bind {PROXY_ADDRESS};", site)
    assert count == 1, "deploy/nginx/svc-auth.conf changed shape"
    return nginx_conf(tmp, site)


class ProxiedStack:
    def __init__(self, port: int, logs: list[Path], nginx_dir: Path, world):
        self.port, self.logs, self.nginx_dir, self.world = port, logs, nginx_dir, world
        self.url = f"http://127.0.0.1:{port}"

    def call(self, method, path, json_body=None, body=None, headers=None):
        headers = dict(headers or {})
        if json_body is not None:
            body = json.dumps(json_body)
            headers["Content-Type"] = "application/json"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=15)
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        try:
            payload = json.loads(raw) if raw else None
        except ValueError:
            payload = raw.decode("utf-8", "replace")
        return response.status, response.headers, payload

    def client_credentials_token(self) -> str:
        app = self.world.app
        status, _, body = self.call("POST", "/v1/oauth/token", body="grant_type=client_credentials", headers={
            "Authorization": basic_auth(app.client_id, self.world.secret),
            "Content-Type": "application/x-www-form-urlencoded"})
        assert status == 200, body
        return body["access_token"]

    def access_lines(self) -> list[list[dict]]:
        """Each serve process's access-log lines (JSON)."""
        result = []
        for path in self.logs:
            lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            result.append([line for line in lines if line["logger"] == "svc_auth.access"])
        return result

    def access_line(self, request_id: str, timeout: float = 5.0) -> dict:
        """The access-log line of one request (written just after its response, so wait a little)."""
        deadline = time.time() + timeout
        while True:
            found = [line for lines in self.access_lines() for line in lines if line["request_id"] == request_id]
            if found or time.time() > deadline:
                assert len(found) == 1, f"expected one access-log line for {request_id}, found {found}"
                return found[0]
            time.sleep(0.05)

    def upstreams_that_served(self, route: str) -> int:
        return sum(1 for lines in self.access_lines() if any(line["route"] == route for line in lines))

    def all_logs(self) -> str:
        return "".join(p.read_text() for p in [*self.logs, self.nginx_dir / "access.log", self.nginx_dir / "error.log"]
                       if p.exists())


@pytest.fixture
def nginx_port():
    return free_port()


@pytest.fixture
def proxied(settings, world, nginx_port, tmp_path):
    upstream_ports = [free_port(), free_port()]
    env = settings_env(settings, SVC_TRUSTED_PROXIES=f"{PROXY_ADDRESS}/32",
                       SVC_REDIS_NAMESPACE=settings.redis_namespace)
    procs, logs = [], []
    nginx_dir = tmp_path / "nginx"
    nginx_dir.mkdir()
    try:
        for port in upstream_ports:
            logs.append(tmp_path / f"serve-{port}.log")
            procs.append(start_process(["serve", "--port", str(port)], env, port, log_path=logs[-1]))
        conf = nginx_config(nginx_dir, nginx_port, upstream_ports)
        nginx = subprocess.Popen([NGINX, "-p", str(nginx_dir), "-c", str(conf), "-e", str(nginx_dir / "error.log")],
                                 stdout=subprocess.DEVNULL, stderr=open(nginx_dir / "stderr.log", "wb"))
        procs.append(nginx)
        try:
            wait_for_port(nginx_port, proc=nginx)
        except RuntimeError:
            raise RuntimeError((nginx_dir / "stderr.log").read_text() + (nginx_dir / "error.log").read_text())
        yield ProxiedStack(nginx_port, logs, nginx_dir, world)
    finally:
        for proc in reversed(procs):
            stop_process(proc)


def test_full_launch_and_client_credentials_through_nginx(proxied, world):
    app = world.app
    status, _, discovery = proxied.call("GET", "/.well-known/openid-configuration")
    assert status == 200 and discovery["issuer"] == proxied.url + "/"  # = the `iss` of our tokens
    assert discovery["token_endpoint"].startswith(proxied.url + "/")
    _, _, jwks = proxied.call("GET", "/.well-known/jwks.json")

    status, _, launch = proxied.call("POST", "/v1/sandbox/launches", {"client_id": app.client_id},
                                     headers={"Authorization": f"Bearer {world.sandbox_token}"})
    assert status == 201, launch
    query = urllib.parse.urlencode({"client_id": app.client_id, "redirect_uri": app.redirect_uri,
                                    "response_type": "code", "launch_id": launch["launch_id"], "state": "s1"})
    status, headers, _ = proxied.call("GET", f"/v1/oauth/authorize?{query}")
    assert status == 302
    location = urllib.parse.urlsplit(headers["Location"])
    code = urllib.parse.parse_qs(location.query)["code"][0]
    status, _, tokens = proxied.call("POST", "/v1/oauth/token", {
        "grant_type": "authorization_code", "client_id": app.client_id, "client_secret": world.secret,
        "code": code})
    assert status == 200, tokens
    claims = jwt.decode(tokens["id_token"], jwks, algorithms=["RS256"], audience=app.client_id,
                        issuer=proxied.url + "/", options={"verify_at_hash": False})
    assert claims["sub"] == world.physician.id
    status, _, info = proxied.call("GET", "/v1/oauth/userinfo",
                                   headers={"Authorization": f"Bearer {tokens['access_token']}"})
    assert status == 200 and info["sub"] == world.physician.id
    partner_token = proxied.client_credentials_token()
    assert jwt.get_unverified_claims(partner_token)["aud"] == "partner-api"

    # Both processes took part: requests are spread, a code minted by one is redeemed by either.
    assert all(lines for lines in proxied.access_lines())
    # Request ids: the caller's is kept, else nginx's $request_id; the service echoes it.
    _, headers, _ = proxied.call("GET", "/healthz", headers={"X-Request-Id": "through-nginx-1"})
    assert headers["X-Request-Id"] == "through-nginx-1"
    _, headers, _ = proxied.call("GET", "/healthz")
    assert re.fullmatch(r"[0-9a-f]{32}", headers["X-Request-Id"])
    # A client cannot forge its address: nginx appends the real one and only nginx is trusted.
    proxied.call("GET", "/healthz", headers={"X-Forwarded-For": "6.6.6.6", "X-Request-Id": "forged-1"})
    assert proxied.access_line("forged-1")["client"] == "127.0.0.1"
    status, _, ready = proxied.call("GET", "/readyz")
    assert status == 200 and ready["checks"]["redis"]["status"] == "ok"
    assert ready["checks"]["database"]["status"] == "ok"

    # Neither the service's logs nor nginx's hold a secret of the flow.
    logs = proxied.all_logs()
    assert "does not match" not in logs and "SVC_ISSUER is" not in logs  # the proxy agrees with SVC_ISSUER
    for secret in (world.secret, code, launch["launch_id"], tokens["access_token"], tokens["id_token"],
                   world.sandbox_token, partner_token):
        assert secret not in logs


def test_one_time_links_in_paths_reach_no_log_through_nginx(proxied, world, runtime):
    """The secret of a one-time link's path (conf/logging.py SECRET_PATHS, the same list in the
    site's map) is in neither nginx's access log nor the service's; nginx wrote it in clear."""
    from conf.logging import SECRET_PATHS
    from hub.sandbox import create_signin_link
    assert re.search(r'"~\^\((.*?)\)"', SITE.read_text()).group(1).split("|") == list(SECRET_PATHS)
    link = urllib.parse.urlsplit(create_signin_link(runtime, world.physician.id)).path
    status, headers, _ = proxied.call("GET", link, headers={"X-Request-Id": "one-time-link-1"})
    assert status == 302
    for prefix in SECRET_PATHS:
        proxied.call("GET", prefix + "not-a-secret-but-looks-like-one")
    assert proxied.access_line("one-time-link-1")["path"] == "/sandbox/signin/[REDACTED]"
    logs = proxied.all_logs()
    assert link.rsplit("/", 1)[1] not in logs and "not-a-secret-but-looks-like-one" not in logs
    assert "GET /sandbox/signin/[REDACTED] HTTP/1.1" in (proxied.nginx_dir / "access.log").read_text()


def test_the_longest_authorization_responses_pass_through_nginx(proxied, world):
    """An authorization response is at most the longest redirect_uri, a 2048-byte state and an error
    description: nginx passes it on (its default 4 KiB header buffer answered 502 past about 4000
    bytes of state, after the launch was spent); a longer state is the service's 400, not a 502."""
    app = world.app

    def authorize(**params):
        status, _, launch = proxied.call("POST", "/v1/sandbox/launches", {"client_id": app.client_id},
                                         headers={"Authorization": f"Bearer {world.sandbox_token}"})
        assert status == 201, launch
        query = {"client_id": app.client_id, "response_type": "code", "launch_id": launch["launch_id"], **params}
        return proxied.call("GET", f"/v1/oauth/authorize?{urllib.parse.urlencode(query)}")

    longest = app.redirect_uri + "/" + "a" * (1000 - len(app.redirect_uri) - 1)
    status, headers, _ = authorize(redirect_uri=longest, state="a" * 2048)
    assert status == 302 and "code=" in headers["Location"]
    status, headers, _ = authorize(redirect_uri=longest, state="a" * 2048, scope="\u00e9" * 300)
    assert status == 302 and "error=invalid_scope" in headers["Location"]
    status, _, _ = authorize(redirect_uri=app.redirect_uri, state="a" * 2049)
    assert status == 400


def test_nginx_limits_body_size_and_keeps_json_413_below_it(proxied, world):
    status, _, body = proxied.call("POST", "/v1/oauth/token", body="x" * (2 * 1024 * 1024),
                                   headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 413  # nginx's client_max_body_size: never reaches Python
    status, _, body = proxied.call("POST", "/v1/oauth/token", body="x" * (100 * 1024),
                                   headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 413 and body["error"] == "request_too_large"  # the service's own JSON answer


def test_rest_rate_limit_is_shared_by_both_processes_behind_nginx(proxied, world):
    """organizations: 10 per 60 s per client, counted in Redis: nginx spreads the calls over both
    processes, and together they allow exactly 10 before answering 429."""
    limit, window = 10, 60
    token = proxied.client_credentials_token()
    if time.time() % window > window - 15:  # keep the burst inside one fixed window
        time.sleep(window - time.time() % window + 0.5)
    path = f"/v1/applications/{world.app.id}/organizations"
    answers = [proxied.call("GET", path, headers={"Authorization": f"Bearer {token}"}) for _ in range(limit + 4)]
    statuses = [status for status, _, _ in answers]
    assert statuses == [200] * limit + [429] * 4, statuses
    _, headers, body = answers[-1]
    assert body["error"] == "rate_limited" and int(headers["Retry-After"]) >= 1
    assert headers["RateLimit-Remaining"] == "0"
    assert answers[limit - 1][1]["RateLimit-Remaining"] == "0" and answers[0][1]["RateLimit-Remaining"] == "9"
    # Both processes served the operation, allowed ones and refused ones alike: the count is shared.
    deadline = time.time() + 5  # each access line is written just after its response
    while True:
        served = [[line["status"] for line in lines if "organizations" in line["route"]]
                  for lines in proxied.access_lines()]
        if sum(map(len, served)) >= limit + 4 or time.time() > deadline:
            break
        time.sleep(0.05)
    assert all(served) and sorted(s for statuses in served for s in statuses) == [200] * limit + [429] * 4
    assert all(200 in statuses for statuses in served)
