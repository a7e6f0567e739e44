"""Several hosts that share only the database (and Redis): real `svc-auth serve` processes with
their own SVC_VAR_DIR and keys directory. Key rotation and secret changes made by the CLI on one
reach the others within a second; a new key is published before it signs."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from jose import jwk, jwt

from helpers.environment import REDIS_URL, ROOT
from helpers.http import basic_auth
from helpers.processes import free_port, settings_env, start_process, stop_process

PREPUBLISH = 4  # long enough to observe "published, not signing yet" on a busy machine


def http(port: int, path: str, body: bytes | None = None, headers=None) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def jwks_kids(port: int) -> list[str]:
    return [k["kid"] for k in http(port, "/.well-known/jwks.json")[1]["keys"]]


def client_token(port: int, client_id: str, secret: str) -> tuple[int, dict]:
    return http(port, "/v1/oauth/token", b"grant_type=client_credentials",
                {"Authorization": basic_auth(client_id, secret), "Content-Type": "application/x-www-form-urlencoded"})


def verify_against(port: int, token: str) -> dict:
    """Verify `token` as a relying party would, with the JWKS that `port` publishes."""
    kid = jwt.get_unverified_header(token)["kid"]
    key = next(k for k in http(port, "/.well-known/jwks.json")[1]["keys"] if k["kid"] == kid)
    return jwt.decode(token, jwk.construct(key), algorithms=["RS256"], audience="partner-api")


def wait_until(predicate, timeout: float, step: float = 0.02) -> float:
    """Seconds until `predicate()` held; fails after `timeout`."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not within {timeout} s")
        time.sleep(step)
    return time.monotonic() - started


class Hosts:
    def __init__(self, settings, tmp_path, **extra):
        self.settings, self.tmp_path, self.extra = settings, tmp_path, extra
        self.ports, self.procs, self.envs = [], [], []

    def host_env(self, name: str) -> dict:
        var = self.tmp_path / name
        return settings_env(self.settings, SVC_VAR_DIR=var, SVC_KEYS_DIR=var / "keys",
                            SVC_KEY_PREPUBLISH_SECONDS=PREPUBLISH, **self.extra)

    def start(self, count: int = 2):
        for i in range(count):
            port, env = free_port(), self.host_env(f"host-{i}")
            self.procs.append(start_process(["serve", "--port", str(port)], env, port,
                                            log_path=self.tmp_path / f"host-{i}.log"))
            self.ports.append(port)
            self.envs.append(env)
        return self

    def cli(self, host: int, *args) -> dict:
        result = subprocess.run([sys.executable, "-m", "cli.__main__", *args, "--json"], env=self.envs[host],
                                cwd=str(ROOT), capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def stop(self):
        for proc in self.procs:
            stop_process(proc)


@pytest.fixture
def hosts(request, settings, tmp_path):
    made = []

    def start(**extra):
        made.append(Hosts(settings, tmp_path, **extra).start())
        return made[-1]
    yield start
    for h in made:
        h.stop()


def shared_backends(backend: str, redis_namespace: str) -> dict:
    """PostgreSQL hosts also share a Redis (pub/sub); the embedded SQLite default has no Redis
    and relies on the version rows."""
    return {"SVC_REDIS_URL": REDIS_URL, "SVC_REDIS_NAMESPACE": redis_namespace} if backend == "postgresql" else {}


@pytest.mark.slow
def test_key_rotation_on_one_host_reaches_every_host(hosts, world, runtime, backend, redis_namespace):
    h = hosts(**shared_backends(backend, redis_namespace))
    a, b = h.ports
    app = world.app
    before = jwks_kids(a)
    assert jwks_kids(b) == before and len(before) == 1
    # Warm both (applications and keys in memory).
    for port in (a, b):
        assert client_token(port, app.client_id, world.secret)[0] == 200

    rotated = h.cli(0, "keys", "rotate")
    new_kid = rotated["kid"]
    assert new_kid not in before
    # Every host publishes the new key within a second ...
    for port in (a, b):
        assert wait_until(lambda: new_kid in jwks_kids(port), timeout=1.0) < 1.0
    # ... and none signs with it before the pre-publication time is over.
    for port in (a, b):
        token = client_token(port, app.client_id, world.secret)[1]["access_token"]
        assert jwt.get_unverified_header(token)["kid"] == before[0]
    assert time.time() < rotated_at(rotated)
    time.sleep(max(0.0, rotated_at(rotated) - time.time()) + 0.3)
    tokens = {}
    for port in (a, b):
        status, body = client_token(port, app.client_id, world.secret)
        assert status == 200 and jwt.get_unverified_header(body["access_token"])["kid"] == new_kid
        tokens[port] = body["access_token"]
    # Tokens signed by either host verify against either host's JWKS; the old key is still published.
    for signer in (a, b):
        for publisher in (a, b):
            assert verify_against(publisher, tokens[signer])["client_id"] == app.client_id
        assert set(jwks_kids(signer)) == {new_kid, before[0]}


def rotated_at(rotated: dict) -> float:
    import datetime as dt
    return dt.datetime.fromisoformat(rotated["signs_from"].replace("Z", "+00:00")).timestamp()


@pytest.mark.slow
def test_secret_activation_on_one_host_reaches_every_warm_host(hosts, world, runtime, backend, redis_namespace):
    h = hosts(**shared_backends(backend, redis_namespace))
    app = world.app
    for port in h.ports:
        assert client_token(port, app.client_id, world.secret)[0] == 200  # cached on every host
    fallback = h.cli(1, "apps", "secret", "generate-fallback", "--app", app.id)["fallback_secret"]
    h.cli(1, "apps", "secret", "activate-fallback", "--app", app.id)
    for port in h.ports:
        assert wait_until(lambda: client_token(port, app.client_id, world.secret)[0] == 401, 1.0) < 1.0
        assert client_token(port, app.client_id, fallback)[0] == 200


def test_a_host_with_another_hmac_key_stops_with_a_message_naming_it(settings, runtime, tmp_path):
    runtime.keyring.active  # noqa: B018  (the keys exist, sealed under the session's SVC_HMAC_KEY)
    env = settings_env(settings, SVC_HMAC_KEY="x" * 40, SVC_VAR_DIR=tmp_path / "other")
    result = subprocess.run([sys.executable, "-m", "cli.__main__", "serve", "--port", str(free_port())],
                            env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "SVC_HMAC_KEY" in result.stderr and "Traceback" not in result.stderr
