"""A rolling SVC_HMAC_KEY rotation caught mid-way by `keys rekey` (issue 45, item 2): two real
`svc-auth serve` hosts, one still on the old key (step 1, not yet restarted) and one on the new,
FHIR reads (each a disclosure record, linked under the key of the host that served it) on both
throughout. The newest record is the new host's, so the chain alone does not show the old host:
its row in key_holder does. `keys rekey` with the right keys is refused (`hosts_on_old_key`,
naming the host, nothing changed) while the old host is up; the old host's reads still link into
one verifiable chain; once it restarts on the new key (its row deleted on shutdown) and with only
a stale row left behind by a host long gone, rekey reseals, and both hosts' later records verify;
a host started at step 1 after the rekey refuses to start (it would link under the closed key)."""
from __future__ import annotations

import datetime as dt
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
from models.disclosures import CHECKPOINT, DisclosureRecord

pytestmark = pytest.mark.svc_settings(own_keys=True)

OLD, NEW = "k" * 32, "n" * 40  # the session's SVC_HMAC_KEY (conftest) and the one it rotates to
STEP1 = {"SVC_HMAC_KEY": OLD, "SVC_HMAC_KEY_PREVIOUS": NEW}  # knows NEW, links under OLD
STEP2 = {"SVC_HMAC_KEY": NEW, "SVC_HMAC_KEY_PREVIOUS": OLD}  # links under NEW


def access_token(port: int, runtime, world, patient: str) -> str:
    """A launch of the world's app by the physician with `patient` in context, code exchanged."""
    from hub.sandbox import issue_sandbox_token
    base = f"http://127.0.0.1:{port}"
    sandbox = issue_sandbox_token(as_service(runtime, runtime.settings.issuer), world.physician)
    status, _, body = http("POST", f"{base}/v1/sandbox/launches", json.dumps(
        {"client_id": world.app.client_id, "patient_id": patient}).encode(),
        {"Authorization": f"Bearer {sandbox}", "Content-Type": "application/json"})
    assert status == 201, body
    query = {"client_id": world.app.client_id, "redirect_uri": world.app.redirect_uri, "response_type": "code",
             "launch": json.loads(body)["launch_id"], "scope": "launch patient/*.rs"}
    status, headers, body = http("GET", f"{base}/v1/oauth/authorize?{urllib.parse.urlencode(query)}")
    assert status == 302, body
    code = urllib.parse.parse_qs(urllib.parse.urlsplit(headers["Location"]).query)["code"][0]
    status, _, body = http("POST", f"{base}/v1/oauth/token", json.dumps(
        {"client_id": world.app.client_id, "client_secret": world.secret, "grant_type": "authorization_code",
         "code": code}).encode(), {"Content-Type": "application/json"})
    assert status == 200, body
    return json.loads(body)["access_token"]


def cli(env: dict, *args) -> tuple[int, dict, str]:
    result = subprocess.run([sys.executable, "-m", "cli.__main__", *args, "--json"], env=env, cwd=str(ROOT),
                            capture_output=True, text=True, timeout=120)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout) if result.stdout.strip() else {}, result.stderr


def test_rekey_waits_for_a_host_still_on_the_old_key_and_the_chain_stays_one(settings, runtime, world, tmp_path):
    patient = patient_panel(world.org.id)[0].id
    procs: dict[str, object] = {}

    def host(name: str, keys: dict) -> tuple[int, object, dict]:
        port = free_port()
        env = settings_env(settings, SVC_VAR_DIR=tmp_path / name, SVC_KEYS_DIR=tmp_path / name / "keys",
                           SVC_FHIR_RATE_LIMIT="100000/60", SVC_FHIR_TOKEN_RATE_LIMIT="100000/60", **keys)
        proc = procs[name] = start_process(["serve", "--port", str(port)], env, port, log_path=tmp_path / f"{name}.log")
        return port, proc, env

    path = f"/fhir/r4/{world.org.id}/Patient/{patient}"
    headers: dict = {}

    def reads(port: int, n: int = 3) -> None:
        for _ in range(n):
            status, _, body = http("GET", f"http://127.0.0.1:{port}{path}", headers=headers)
            assert status == 200, (port, status, body[:300])

    class Reading(threading.Thread):
        """Reads on `ports` in turn while a rekey runs: the records keep coming throughout."""

        def __init__(self, *ports: int):
            super().__init__(daemon=True)
            self.ports, self.stop, self.statuses = ports, threading.Event(), []

        def run(self):
            turn = 0
            while not self.stop.is_set():
                port = self.ports[turn % len(self.ports)]
                turn += 1
                self.statuses.append(http("GET", f"http://127.0.0.1:{port}{path}", headers=headers)[0])

        def __enter__(self):
            self.start()
            return self

        def __exit__(self, *exc):
            self.stop.set()
            self.join(60)
            assert self.statuses and set(self.statuses) == {200}, self.statuses

    def records() -> tuple[int, int]:
        return DisclosureRecord.select().count(), DisclosureRecord.select().where(
            DisclosureRecord.action == CHECKPOINT).count()

    try:
        a, a_proc, _ = host("a", STEP1)  # not yet restarted: links under OLD
        b, _, b_env = host("b", STEP2)  # restarted: links under NEW
        headers.update({"Authorization": f"Bearer {access_token(b, runtime, world, patient)}",
                        "Accept": "application/fhir+json"})
        reads(a), reads(b), reads(a), reads(b)  # both keys linking side by side: one chain
        code, result, _ = cli(b_env, "audit", "verify")
        assert code == 0 and result["ok"], result

        # The newest record is b's (NEW): the chain does not show that a still links under OLD. Refused.
        before = records()
        code, result, err = cli(b_env, "keys", "rekey")  # nothing reads meanwhile: `before` is exact
        assert code == 1 and result.get("refused", {}).get("cause") == "hosts_on_old_key", (result, err)
        assert result["resealed"] == 0 and result["still_old"]["audit_records"] >= 6, result
        named = result["refused"]["hosts"]
        assert [(h["pid"], h["key_id"], h["role"]) for h in named] == [(a_proc.pid, key_id(OLD.encode()), "serve")]
        assert named[0]["holder"] in result["refused"]["reason"]
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "hosts_on_old_key" in lines[0] and named[0]["holder"] in lines[0], err
        assert records() == before  # nothing appended: no reseal checkpoint
        from models.key_holders import KeyHolder
        assert {(h.pid, h.key_id) for h in KeyHolder.select()} == {(a_proc.pid, key_id(OLD.encode())),
                                                                   (procs["b"].pid, key_id(NEW.encode()))}

        with Reading(a, b):  # a refused rekey again, both hosts linking meanwhile
            code, result, _ = cli(b_env, "keys", "rekey")
        # (refused either way: the newest record may be a's now, which the chain itself shows)
        assert code == 1 and result["refused"]["cause"] in ("hosts_on_old_key", "old_key_still_linking"), result
        assert result["resealed"] == 0 and records()[1] == before[1], result
        assert result["still_old"]["signing_keys"] >= 1  # refused early or under the lock: no key re-sealed
        reads(a), reads(b)  # a's next records still link, and the chain verifies
        code, result, _ = cli(b_env, "audit", "verify")
        assert code == 0 and result["ok"], result

        # a restarts on the new key: its row goes with it (a clean shutdown).
        stop_process(procs.pop("a"))
        assert KeyHolder.select().where(KeyHolder.pid == a_proc.pid).count() == 0
        a, _, a_env = host("a2", STEP2)
        # A host killed long ago left its row: older than SVC_KEY_HOLDER_WINDOW, it holds nothing up.
        long_ago = runtime.clock.now() - dt.timedelta(seconds=runtime.settings.key_holder_window + 5)
        KeyHolder.create(holder="gone:1:abc", host="gone", pid=1, role="serve", key_id=key_id(OLD.encode()),
                         previous_key_ids=[], started_at=long_ago, seen_at=long_ago)
        reads(a), reads(b)
        with Reading(a, b):  # the rekey reseals while both hosts (now on NEW) link records
            code, result, err = cli(a_env, "keys", "rekey")
        assert code == 0 and "refused" not in result, (result, err)
        assert result["resealed"] >= 9 and result["still_old"]["audit_records"] == 0, result
        assert records()[1] == before[1] + 1  # the reseal checkpoint

        reads(b), reads(a)  # after the reseal: both hosts link under NEW, the old key closed
        # A host started at step 1 after the rekey would link under the key it closed: it refuses, one line.
        env = settings_env(settings, SVC_VAR_DIR=tmp_path / "late", SVC_KEYS_DIR=tmp_path / "late" / "keys", **STEP1)
        late = subprocess.run([sys.executable, "-m", "cli.__main__", "serve", "--port", str(free_port())], env=env,
                              cwd=str(ROOT), capture_output=True, text=True, timeout=120)
        lines = late.stderr.strip().splitlines()
        assert late.returncode == 2 and len(lines) == 1, late.stderr
        assert "keys rekey" in lines[0] and key_id(NEW.encode()) in lines[0] and "SVC_HMAC_KEY_PREVIOUS" in lines[0]
        code, _, err = cli(env, "audit", "prune")  # a shell at step 1: its checkpoint would link under OLD
        assert code == 2 and len(err.strip().splitlines()) == 1 and "keys rekey" in err, err
        code, result, _ = cli(a_env, "audit", "verify")
        assert code == 0 and result["ok"] and result["records"] == records()[0], result
    finally:
        for proc in procs.values():
            stop_process(proc)
