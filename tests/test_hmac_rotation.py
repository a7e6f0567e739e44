"""Rotating SVC_HMAC_KEY (issue 36): real `svc-auth serve` hosts restarted through the documented
procedure (docs/operations.md) while a partner keeps getting tokens with its secret; the old key
keeps verifying what it made until `keys rekey` says nothing needs it; a wrong key stops a host."""
from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request

import pytest

from audit.chain import verify
from audit.disclosures import Disclosure, record
from helpers.chain import a_record_the_old_key_links_is_refused
from helpers.environment import ROOT
from helpers.http import basic_auth
from helpers.processes import free_port, settings_env, start_process, stop_process
from keys.secrets import SecretHasher
from lifecycle.applications import register_application
from models.disclosures import DisclosureRecord
from partner_api.invitations import invite
from runtime import Runtime

pytestmark = pytest.mark.svc_settings(own_keys=True)

STORED_HASHES = ("refresh_tokens", "authorization_codes", "invitations", "developer_invites", "console_sessions",
                 "sandbox_sessions", "sandbox_signin_links")
"""Kinds of keyed hashes `keys rekey` counts besides client secrets (issue 45; none is live here)."""
OLD, NEW = "k" * 32, "n" * 40  # the session's SVC_HMAC_KEY (conftest) and the one it rotates to


def call(port: int, path: str, body: bytes | None = None, headers=None) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def client_token(port: int, client_id: str, secret: str) -> int:
    return call(port, "/v1/oauth/token", b"grant_type=client_credentials",
                {"Authorization": basic_auth(client_id, secret),
                 "Content-Type": "application/x-www-form-urlencoded"})[0]


def jwks_kids(port: int) -> set[str]:
    return {k["kid"] for k in json.loads(call(port, "/.well-known/jwks.json")[1])["keys"]}


class Partner(threading.Thread):
    """A partner's backend getting tokens with its secret, over and over, from whichever hosts
    are up (a host is taken out of `ports` before it is stopped, as a load balancer drains it)."""

    def __init__(self, client_id: str, secret: str):
        super().__init__(daemon=True)
        self.client_id, self.secret = client_id, secret
        self.ports: list[int] = []
        self.lock = threading.Condition()
        self.busy: int | None = None  # the port of the request in flight
        self.statuses: list[int] = []
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self):
        turn = 0
        while not self.stop.is_set():
            with self.lock:
                port = self.busy = self.ports[turn % len(self.ports)] if self.ports else None
            turn += 1
            if port is None:
                continue
            try:
                self.statuses.append(client_token(port, self.client_id, self.secret))
            except OSError as exc:
                self.errors.append(repr(exc))
            finally:
                with self.lock:
                    self.busy = None
                    self.lock.notify_all()

    def add(self, port: int):
        with self.lock:
            self.ports.append(port)

    def remove(self, port: int):
        """Out of the rotation, once its request in flight (if any) has its answer: a load balancer
        drains a host before it is stopped."""
        with self.lock:
            self.ports.remove(port)
            self.lock.wait_for(lambda: self.busy != port, timeout=60)


def cli(env: dict, *args) -> tuple[int, dict]:
    result = subprocess.run([sys.executable, "-m", "cli.__main__", *args, "--json"], env=env, cwd=str(ROOT),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def disclose(runtime, n: int) -> None:
    for i in range(n):
        record(runtime, Disclosure("read", organization_id="org_rot", user_id=f"usr_{i}", resource_type="Patient",
                                   resource_ids=(f"pat_{i}",), patients=(f"pat_{i}",)), "success", 200)


def test_rotating_the_hmac_key_under_load_locks_no_partner_out(settings, runtime, world, tmp_path):
    # What the old key made: signing keys (and their JWKS kids), an EHR client key, a secret that is
    # never used during the rotation, a signed chart URL, an invitation link, disclosure records.
    old_kid = runtime.keyring.active.kid
    runtime.ehr_keys.current()
    idle, idle_secret = register_application(runtime, "Idle App", "https://idle.example/main",
                                             "https://idle.example/launch")
    chart = tmp_path / "chart.zip"
    chart.write_bytes(b"PK\x05\x06" + b"\0" * 18)
    runtime.object_store.put_file("charts/rotation.zip", str(chart))
    url = urllib.parse.urlsplit(runtime.object_store.presigned_url("charts/rotation.zip", 3600))
    invited = invite(runtime, world.app, {"email": "ann@clinic.example", "given_name": "Ann", "family_name": "Example",
                                          "organization_name": "Ann's Clinic"})
    invitation = urllib.parse.urlsplit(invited["invitation_url"]).path
    disclose(runtime, 5)

    def host(name: str, **keys) -> tuple[int, object, dict]:
        port = free_port()
        env = settings_env(settings, SVC_VAR_DIR=tmp_path / name, SVC_KEYS_DIR=tmp_path / name / "keys", **keys)
        return port, start_process(["serve", "--port", str(port)], env, port, log_path=tmp_path / f"{name}.log"), env

    partner = Partner(world.app.client_id, world.secret)
    first, first_proc, _ = host("old")
    partner.add(first)
    partner.start()
    try:
        # 1) every host learns the new key as a previous one, still making everything with the old.
        second, second_proc, _ = host("learns", SVC_HMAC_KEY=OLD, SVC_HMAC_KEY_PREVIOUS=NEW)
        partner.add(second)
        partner.remove(first)
        stop_process(first_proc)
        # 2) every host makes everything with the new key and still accepts the old one.
        third, third_proc, env = host("rotated", SVC_HMAC_KEY=NEW, SVC_HMAC_KEY_PREVIOUS=OLD)
        partner.add(third)
        partner.remove(second)
        stop_process(second_proc)
        before = len(partner.statuses)
        while len(partner.statuses) < before + 20 and not partner.errors:
            partner.stop.wait(0.05)  # tokens from the rotated host alone
    finally:
        partner.stop.set()
        partner.join(30)
    try:
        assert partner.errors == [] and len(partner.statuses) > 20
        assert set(partner.statuses) == {200}, {s: partner.statuses.count(s) for s in set(partner.statuses)}
        assert old_kid in jwks_kids(third)
        status, body = call(third, f"{url.path}?{url.query}")
        assert status == 200 and body == chart.read_bytes()
        connection = http.client.HTTPConnection("127.0.0.1", third, timeout=30)
        connection.request("GET", invitation)  # accepted: the sandbox user is signed in and sent to the hub
        answer = connection.getresponse()
        assert answer.status == 302 and answer.getheader("Location").endswith("/sandbox/hub"), answer.read()
        connection.close()
        rotated = Runtime(settings.replace(hmac_key=NEW, hmac_key_previous=(OLD,)))
        try:
            disclose(rotated, 3)  # linked under the new key after the old key's records
        finally:
            rotated.close()
        code, result = cli(env, "audit", "verify")
        assert code == 0 and result["ok"] and result["records"] == 9, result  # with the chart download's

        code, result = cli(env, "keys", "rekey")
        assert code == 0, result
        # Re-sealed: the signing key, the EHR client key and the 5 records only the old key linked.
        assert result["resealed"] == 7, result
        # The idle partner's secret was hashed under the old key and never presented since.
        assert result["still_old"] == {"signing_keys": 0, "ehr_client_keys": 0, "totp_secrets": 0, "client_secrets": 1,
                                       "audit_records": 0, **dict.fromkeys(STORED_HASHES, 0)}, result
        assert cli(env, "keys", "rekey")[1] == {"resealed": 0, "still_old": result["still_old"]}
        assert client_token(third, idle.client_id, idle_secret) == 200  # re-hashed now
        assert cli(env, "keys", "rekey")[1]["still_old"]["client_secrets"] == 0
    finally:
        stop_process(third_proc)

    # 3) nothing needs the old key: it is dropped.
    last, last_proc, env = host("retired", SVC_HMAC_KEY=NEW)
    try:
        assert client_token(last, world.app.client_id, world.secret) == 200
        assert client_token(last, idle.client_id, idle_secret) == 200
        assert old_kid in jwks_kids(last)
        code, result = cli(env, "audit", "verify")
        assert code == 0 and result["ok"] and result["records"] == 10, result  # and the reseal checkpoint
        code, result = cli(env, "keys", "list")
        assert code == 0 and result["active_kid"] == old_kid
    finally:
        stop_process(last_proc)


def test_after_the_rotation_a_retired_key_forges_nothing_and_edits_still_show(settings, runtime):
    """The reseal checkpoint commits to what only the old key linked: without the old key, an edit
    of such a record is found; and a record linked under the retired key after it (the key leaked)
    is refused."""
    from audit.disclosures import chain_keys  # (imported here: the rotation test runs on older code too)
    disclose(runtime, 4)
    rotated = Runtime(settings.replace(hmac_key=NEW, hmac_key_previous=(OLD,)))
    try:
        disclose(rotated, 2)
        from keys.rekey import rekey
        assert rekey(rotated)["still_old"]["audit_records"] == 0
        new_only = SecretHasher(NEW.encode()).derive_all(b"svc-auth disclosure chain v1")
        assert verify(new_only)["ok"] and verify(chain_keys(rotated))["ok"]
        a_record_the_old_key_links_is_refused(runtime, rotated)  # after the checkpoint
    finally:
        rotated.close()


def test_an_edit_of_a_record_only_the_retired_key_linked_is_found(backend, settings, runtime):
    if backend != "sqlite":
        pytest.skip("PostgreSQL's trigger refuses the UPDATE itself")
    disclose(runtime, 4)
    rotated = Runtime(settings.replace(hmac_key=NEW, hmac_key_previous=(OLD,)))
    try:
        from keys.rekey import rekey
        assert rekey(rotated)["resealed"] >= 4
        new_only = SecretHasher(NEW.encode()).derive_all(b"svc-auth disclosure chain v1")
        assert verify(new_only)["ok"]
        DisclosureRecord.update(user_id="usr_someone_else").where(DisclosureRecord.seq == 2).execute()
        result = verify(new_only)
        # Without the old key the walk cannot tell which of the records it linked changed: from the first.
        assert not result["ok"] and result["first_bad"] == 1 and "reseal checkpoint" in result["reason"], result
    finally:
        rotated.close()


def test_a_host_with_a_key_that_opens_nothing_refuses_to_start_with_one_line(settings, runtime, tmp_path):
    runtime.keyring.active  # noqa: B018  (the signing keys exist, sealed under the old key)
    env = settings_env(settings, SVC_HMAC_KEY="w" * 40, SVC_HMAC_KEY_PREVIOUS="x" * 40 + "," + "y" * 40,
                       SVC_VAR_DIR=tmp_path / "wrong")
    result = subprocess.run([sys.executable, "-m", "cli.__main__", "serve", "--port", str(free_port())],
                            env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "SVC_HMAC_KEY" in lines[0], result.stderr


def test_a_prune_never_splits_what_a_reseal_checkpoint_vouches_for(settings, runtime):
    """Records the old key linked go all at once: a prune of part of them would leave the rest
    unverifiable once the old key is retired."""
    import datetime as dt
    from audit.chain import prune
    from audit.disclosures import chain_key
    from keys.rekey import rekey
    earlier = Runtime(settings.replace(clock_offset=-3600))
    try:
        disclose(earlier, 2)  # an hour ago
    finally:
        earlier.close()
    disclose(runtime, 2)
    rotated = Runtime(settings.replace(hmac_key=NEW, hmac_key_previous=(OLD,)))
    new_only = SecretHasher(NEW.encode()).derive_all(b"svc-auth disclosure chain v1")
    try:
        assert rekey(rotated)["resealed"] == 4
        result = prune(rotated.db, chain_key(rotated), rotated.clock.now() - dt.timedelta(minutes=30),
                       rotated.clock.now, {"actor": "test"})
        assert result == {"removed": 0, "pruned_through": None}
        assert verify(new_only) == {"ok": True, "records": 5, "head": verify(new_only)["head"]}
        result = prune(rotated.db, chain_key(rotated), rotated.clock.now() + dt.timedelta(minutes=1),
                       rotated.clock.now, {"actor": "test"})
        assert result["removed"] == 5
        assert verify(new_only)["ok"]
    finally:
        rotated.close()
