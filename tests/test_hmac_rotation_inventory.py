"""Rotating SVC_HMAC_KEY by docs/operations.md with nothing forgotten and no order that breaks the
chain (issue 45, items 1 and 2): real `svc-auth serve` hosts, two at a time, rolled from the old
key to the new while FHIR reads (each a disclosure record, linked by the host that served it) go
on throughout; an offline grant that is not used during the rotation; `keys rekey` run with the
keys the wrong way round (a shell at step 1) and while a host still links under the old key, both
refused with nothing changed; dropping SVC_HMAC_KEY_PREVIOUS while the idle grant still needs it
refused at start with one line; the grant re-keyed by its next use; then the old key dropped."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.parse

import pytest

from connectors.sandbox import patient_panel
from helpers.environment import ROOT
from helpers.http import http
from helpers.processes import free_port, settings_env, start_process, stop_process
from helpers.tokens import as_service
from keys.secrets import key_id
from lifecycle.applications import set_smart_scopes
from models.application import DEFAULT_SMART_SCOPES
from models.refresh import RefreshToken

pytestmark = pytest.mark.svc_settings(own_keys=True)

OLD, NEW = "k" * 32, "n" * 40  # the session's SVC_HMAC_KEY (conftest) and the one it rotates to
SCOPE = "launch offline_access patient/*.rs"


def launch(port: int, runtime, world, app, patient: str, scope: str = SCOPE) -> dict:
    """A launch of `app` by the physician with `patient` in context, code exchanged: the token response."""
    from hub.sandbox import issue_sandbox_token
    base = f"http://127.0.0.1:{port}"
    sandbox = issue_sandbox_token(as_service(runtime, runtime.settings.issuer), world.physician)
    status, _, body = http("POST", f"{base}/v1/sandbox/launches", json.dumps(
        {"client_id": app.client_id, "patient_id": patient}).encode(),
        {"Authorization": f"Bearer {sandbox}", "Content-Type": "application/json"})
    assert status == 201, body
    query = {"client_id": app.client_id, "redirect_uri": app.redirect_uri, "response_type": "code",
             "launch": json.loads(body)["launch_id"], "scope": scope}
    status, headers, body = http("GET", f"{base}/v1/oauth/authorize?{urllib.parse.urlencode(query)}")
    assert status == 302, body
    code = urllib.parse.parse_qs(urllib.parse.urlsplit(headers["Location"]).query)["code"][0]
    return token(port, app, world.secret, {"grant_type": "authorization_code", "code": code})[1]


def token(port: int, app, secret: str, form: dict) -> tuple[int, dict]:
    status, _, body = http("POST", f"http://127.0.0.1:{port}/v1/oauth/token", json.dumps(
        {"client_id": app.client_id, "client_secret": secret, **form}).encode(), {"Content-Type": "application/json"})
    return status, json.loads(body)


class Reader(threading.Thread):
    """An app reading its patient from whichever hosts are up, over and over: every read is a
    disclosure record, linked under the key of the host that served it."""

    def __init__(self, org_id: str, patient: str, access_token: str):
        super().__init__(daemon=True)
        self.path = f"/fhir/r4/{org_id}/Patient/{patient}"
        self.headers = {"Authorization": f"Bearer {access_token}", "Accept": "application/fhir+json"}
        self.ports: list[int] = []
        self.served: dict[int, int] = {}
        self.failures: list = []
        self.lock = threading.Condition()
        self.paused = True
        self.busy = False
        self.stop = threading.Event()

    def run(self):
        turn = 0
        while not self.stop.is_set():
            with self.lock:
                self.lock.wait_for(lambda: not self.paused or self.stop.is_set())
                if self.stop.is_set():
                    return
                port = self.ports[turn % len(self.ports)]
                self.busy = True
            turn += 1
            try:
                status, _, body = http("GET", f"http://127.0.0.1:{port}{self.path}", headers=self.headers)
                if status == 200:
                    self.served[port] = self.served.get(port, 0) + 1
                else:
                    self.failures.append((port, status, body[:200]))
            except OSError as exc:
                self.failures.append((port, repr(exc)))
            finally:
                with self.lock:
                    self.busy = False
                    self.lock.notify_all()

    def set(self, ports: list[int] | None = None, paused: bool = False) -> None:
        """New ports and/or a pause; returns once no read is in flight on a port taken out (or at all, paused)."""
        with self.lock:
            if ports is not None:
                self.paused = True
                self.lock.wait_for(lambda: not self.busy)
                self.ports = list(ports)
            self.paused = paused
            if paused:
                self.lock.wait_for(lambda: not self.busy)
            self.lock.notify_all()

    def until(self, port: int, reads: int) -> None:
        """Until `port` has served `reads` more reads."""
        goal = self.served.get(port, 0) + reads
        done = threading.Event()
        while self.served.get(port, 0) < goal and not self.failures:
            done.wait(0.02)  # polling what another thread counts
        assert self.failures == [], self.failures


def cli(env: dict, *args) -> tuple[int, dict, str]:
    result = subprocess.run([sys.executable, "-m", "cli.__main__", *args, "--json"], env=env, cwd=str(ROOT),
                            capture_output=True, text=True, timeout=120)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout) if result.stdout.strip() else {}, result.stderr


def test_a_rolling_rotation_keeps_an_idle_offline_grant_and_one_chain(settings, runtime, world, tmp_path):
    app = set_smart_scopes(runtime, world.app.id, DEFAULT_SMART_SCOPES + " offline_access")
    patient = patient_panel(world.org.id)[0].id
    hosts: dict[str, tuple[int, object, dict]] = {}

    def host(name: str, **keys):
        port = free_port()
        env = settings_env(settings, SVC_VAR_DIR=tmp_path / name, SVC_KEYS_DIR=tmp_path / name / "keys",
                           SVC_FHIR_RATE_LIMIT="100000/60", SVC_FHIR_TOKEN_RATE_LIMIT="100000/60", **keys)
        hosts[name] = (port, start_process(["serve", "--port", str(port)], env, port, log_path=tmp_path / f"{name}.log"),
                       env)
        return hosts[name]

    def stop(name: str):
        stop_process(hosts.pop(name)[1])

    step1 = {"SVC_HMAC_KEY": OLD, "SVC_HMAC_KEY_PREVIOUS": NEW}
    step2 = {"SVC_HMAC_KEY": NEW, "SVC_HMAC_KEY_PREVIOUS": OLD}
    a, _, _ = host("a")
    idle = launch(a, runtime, world, app, patient)  # the offline grant nobody uses during the rotation
    reading = launch(a, runtime, world, app, patient, "launch patient/*.rs")  # no refresh token
    assert idle["refresh_token"]
    reader = Reader(world.org.id, patient, reading["access_token"])
    reader.start()
    try:
        reader.set([a])
        reader.until(a, 3)
        # Step 1, host by host: every host learns NEW, still making everything with OLD.
        b, _, b_env = host("b", **step1)
        reader.set([a, b])
        reader.until(b, 3)
        reader.set([b])
        stop("a")
        c, _, c_env = host("c", **step1)
        reader.set([b, c])
        reader.until(c, 3)
        # Step 2, host by host: b makes everything with NEW while c is still at step 1.
        reader.set([c])
        stop("b")
        b, _, b_env = host("b2", **step2)
        reader.set([b, c])
        reader.until(b, 3)
        reader.until(c, 3)
        # A shell still at step 1 (c's env file) runs rekey: the keys contradict the chain. Refused.
        reader.set(paused=True)
        code, result, err = cli(c_env, "keys", "rekey")
        assert code == 1 and result["refused"]["cause"] == "keys_in_wrong_order", (result, err)
        assert result["resealed"] == 0 and len(err.strip().splitlines()) == 1 and "wrong way round" in err
        # The right keys, but c (step 1) linked the newest record: a host still on the old key. Refused.
        status, _, _ = http("GET", f"http://127.0.0.1:{c}{reader.path}", headers=reader.headers)
        assert status == 200
        code, result, err = cli(b_env, "keys", "rekey")
        assert code == 1 and result["refused"]["cause"] == "old_key_still_linking", (result, err)
        code, result, _ = cli(b_env, "audit", "verify")
        assert code == 0 and result["ok"], result
        reader.set(paused=False)
        reader.until(b, 2)
        reader.until(c, 2)  # both keys linking side by side: one chain
        reader.set([b])
        stop("c")
        c, _, c_env = host("c2", **step2)
        reader.set([b, c])
        reader.until(c, 3)
        reader.until(b, 3)
        reader.set(paused=True)
        assert reader.failures == []
        code, result, _ = cli(c_env, "audit", "verify")
        assert code == 0 and result["ok"], result
        # Step 3: rekey. The idle grant's refresh token still needs OLD: counted.
        code, result, err = cli(c_env, "keys", "rekey")
        assert code == 0, (result, err)
        assert result["still_old"]["refresh_tokens"] == 1 and result["still_old"]["audit_records"] == 0, result
        assert result["still_old"]["signing_keys"] == 0 and result["resealed"] >= 2, result
    finally:
        reader.stop.set()
        with reader.lock:
            reader.lock.notify_all()
        reader.join(30)

    assert RefreshToken.get(RefreshToken.spent_at.is_null(True)).key_id == key_id(OLD.encode())  # noted
    # Step 5 too early: a host without OLD refuses to start, with one line naming what stops working.
    env = settings_env(settings, SVC_VAR_DIR=tmp_path / "early", SVC_KEYS_DIR=tmp_path / "early" / "keys",
                       SVC_HMAC_KEY=NEW)
    early = subprocess.run([sys.executable, "-m", "cli.__main__", "serve", "--port", str(free_port())], env=env,
                           cwd=str(ROOT), capture_output=True, text=True, timeout=120)
    lines = early.stderr.strip().splitlines()
    assert early.returncode == 2 and len(lines) == 1, early.stderr
    assert "SVC_HMAC_KEY_PREVIOUS" in lines[0] and key_id(OLD.encode()) in lines[0] and "refresh tokens" in lines[0]

    # The idle grant is used at last (on a step-2 host): its next refresh token is made under NEW.
    status, refreshed = token(c, app, world.secret, {"grant_type": "refresh_token",
                                                     "refresh_token": idle["refresh_token"]})
    assert status == 200, refreshed
    assert RefreshToken.get(RefreshToken.spent_at.is_null(True)).key_id == key_id(NEW.encode())
    code, result, _ = cli(c_env, "keys", "rekey")
    assert code == 0 and set(result["still_old"].values()) == {0}, result
    for name in list(hosts):
        stop(name)

    # Step 5: nothing needs OLD. A host without it starts; the grant refreshes; the chain verifies.
    last, _, env = host("last", SVC_HMAC_KEY=NEW)
    try:
        status, again = token(last, app, world.secret, {"grant_type": "refresh_token",
                                                        "refresh_token": refreshed["refresh_token"]})
        assert status == 200 and again["refresh_token"], again
        code, result, _ = cli(env, "audit", "verify")
        assert code == 0 and result["ok"], result
    finally:
        stop("last")


@pytest.mark.gen_test(timeout=120)
async def test_rekey_counts_an_idle_refresh_token_and_serve_refuses_to_drop_its_key(api, settings, runtime, world,
                                                                                      tmp_path):
    from helpers.smart import SmartClient
    from keys.rekey import rekey
    from runtime import Runtime
    smart = world.smart(runtime, DEFAULT_SMART_SCOPES + " offline_access")
    client = SmartClient(api, smart.app, smart.secret, world.sandbox_token, world.org.id)
    await client.tokens("launch offline_access patient/*.rs")
    rotated = Runtime(settings.replace(hmac_key=NEW, hmac_key_previous=(OLD,)))
    try:
        counted = rekey(rotated)["still_old"]
    finally:
        rotated.close()
    assert counted["refresh_tokens"] == 1, counted
    port = free_port()
    env = settings_env(settings, SVC_VAR_DIR=tmp_path / "dropped", SVC_HMAC_KEY=NEW)
    refused = subprocess.run([sys.executable, "-m", "cli.__main__", "serve", "--port", str(port)], env=env,
                             cwd=str(ROOT), capture_output=True, text=True, timeout=120)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1 and "refresh tokens" in lines[0], refused.stderr
    # The operator lets them go on purpose: it starts.
    env["SVC_HMAC_KEY_RETIRED"] = key_id(OLD.encode())
    stop_process(start_process(["serve", "--port", str(port)], env, port, log_path=tmp_path / "retired.log"))


def test_serve_refuses_to_drop_the_key_that_linked_the_chain_until_a_rekey_vouches(settings, runtime, tmp_path):
    from audit.disclosures import Disclosure, record
    from keys.rekey import rekey
    from runtime import Runtime
    for n in range(3):  # linked under OLD
        record(runtime, Disclosure("read", organization_id="org_k", resource_type="Patient", patients=(f"p{n}",)),
               "success", 200)

    def start(**extra) -> subprocess.CompletedProcess | None:
        port = free_port()
        env = settings_env(settings, SVC_VAR_DIR=tmp_path / "new", SVC_HMAC_KEY=NEW, **extra)
        if extra:
            stop_process(start_process(["serve", "--port", str(port)], env, port, log_path=tmp_path / "new.log"))
            return None
        return subprocess.run([sys.executable, "-m", "cli.__main__", "serve", "--port", str(port)], env=env,
                              cwd=str(ROOT), capture_output=True, text=True, timeout=120)

    refused = start()
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert "disclosure chain from seq 2" in lines[0] and "keys rekey" in lines[0], lines
    start(SVC_HMAC_KEY_RETIRED="disclosure-chain")  # the operator accepts it: it starts
    rotated = Runtime(settings.replace(hmac_key=NEW, hmac_key_previous=(OLD,)))
    try:
        assert rekey(rotated)["still_old"]["audit_records"] == 0
    finally:
        rotated.close()
    assert start(SVC_LOG_LEVEL="INFO") is None  # vouched for: it starts without OLD


@pytest.mark.gen_test(timeout=120)
async def test_a_console_session_past_its_lifetime_needs_no_old_key(http_client, base_url, settings, runtime, world):
    """`keys rekey` and `serve`'s start count a console session made under the old key while it lives,
    and not once its absolute lifetime is over, however recently it was used."""
    from console.accounts import invite_developer
    from helpers.console import ConsoleClient
    from keys.inventory import orphaned
    from keys.rekey import rekey
    from runtime import Runtime

    def counted() -> tuple[int, int]:
        """(still old for `keys rekey` while rotating, orphaned for `serve` once OLD is dropped)"""
        rotated = Runtime(settings.replace(hmac_key=NEW, hmac_key_previous=(OLD,)), clock=runtime.clock)
        dropped = Runtime(settings.replace(hmac_key=NEW), clock=runtime.clock)
        try:
            return (rekey(rotated)["still_old"]["console_sessions"],
                    orphaned(dropped).get(key_id(OLD.encode()), {}).get("console_sessions", 0))
        finally:
            rotated.close()
            dropped.close()

    password = "correct horse battery staple"
    console = ConsoleClient(http_client, base_url)
    path = urllib.parse.urlsplit(invite_developer(runtime, world.app.id, "dev@partner.example")[1]).path
    assert (await console.get(path)).code == 200
    assert (await console.post(path, {"password": password, "confirm": password})).code == 303, console.last_html
    assert (await console.sign_in("dev@partner.example", password)).code == 303, console.last_html
    await console.keep_busy(runtime, runtime.settings.console_session_lifetime - 60)
    assert counted() == (1, 1)
    runtime.clock.advance(120)  # past the lifetime, used two minutes ago
    assert counted() == (0, 0)
