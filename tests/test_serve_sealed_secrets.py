"""`serve` opens, before it serves, every sealed secret it will need, as it does the signing keys: a
console TOTP secret or an EHR client key that no key of SVC_HMAC_KEY and SVC_HMAC_KEY_PREVIOUS
opens (a host that sealed it had another key, or the key that sealed it was dropped) stops it with
one line, instead of developers' sign-ins failing as wrong codes, or EHR token requests failing,
later. Each case runs the real `svc-auth serve`."""
from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from helpers.environment import ROOT
from helpers.processes import free_port, settings_env, start_process, stop_process
from keys.ehr_client import EhrClientKeys
from keys.encryption import KeyCipher
from keys.secrets import SecretHasher
from keys.totp import seal_totp
from models.developers import Developer

pytestmark = pytest.mark.svc_settings(own_keys=True)

OTHER = b"o" * 40  # a key this host was never given


def serve(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.__main__", "serve", "--port", str(free_port())], env=env,
                          cwd=str(ROOT), capture_output=True, text=True, timeout=60)  # (old code: it served)


def developer(runtime, email: str, hasher) -> str:
    row = Developer.create(email=email, password_hash="x", created_at=runtime.clock.now())
    sealed = seal_totp(SimpleNamespace(hasher=hasher), row.id, "JBSWY3DPEHPK3PXP")
    Developer.update(totp_secret=sealed).where(Developer.id == row.id).execute()
    return row.id


def test_a_totp_secret_no_key_opens_stops_serve_with_one_line(settings, runtime, tmp_path):
    runtime.keyring.active  # noqa: B018  (the signing keys, sealed under this host's key: they open)
    developer(runtime, "good@example.com", runtime.hasher)
    developer(runtime, "lost@example.com", SecretHasher(OTHER))
    result = serve(settings_env(settings))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "1 console TOTP" in lines[0] and "SVC_HMAC_KEY_PREVIOUS" in lines[0], lines
    assert "SVC_HMAC_KEY_RETIRED=totp-secrets" in lines[0], lines
    # The key that sealed it given back as a previous key: it starts; so it does when they are let go.
    port = free_port()
    env = settings_env(settings, SVC_HMAC_KEY_PREVIOUS=OTHER.decode())
    stop_process(start_process(["serve", "--port", str(port)], env, port, log_path=tmp_path / "previous.log"))
    env = settings_env(settings, SVC_HMAC_KEY_RETIRED="totp-secrets")
    stop_process(start_process(["serve", "--port", str(port)], env, port, log_path=tmp_path / "retired.log"))


def test_an_ehr_client_key_no_key_opens_stops_serve_with_one_line(settings, runtime):
    runtime.keyring.active  # noqa: B018
    kid = EhrClientKeys(KeyCipher(OTHER)).add()  # created by a host with another SVC_HMAC_KEY
    result = serve(settings_env(settings))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert f"EHR client key {kid} " in lines[0] and "SVC_HMAC_KEY" in lines[0], lines


@pytest.mark.svc_settings(own_keys=True, redis=True)
def test_an_ehr_client_key_no_key_opens_stops_the_worker_with_one_line(settings, runtime):
    """The worker signs with the EHR client keys (the nights, the charts): it refuses one it cannot
    open before it takes a task, as `serve` does, instead of every clinic's night failing later."""
    runtime.keyring.active  # noqa: B018
    kid = EhrClientKeys(KeyCipher(OTHER)).add()
    result = subprocess.run([sys.executable, "-m", "cli.__main__", "worker", "--threads", "1"],
                            env=settings_env(settings), cwd=str(ROOT), capture_output=True, text=True,
                            timeout=60)  # (old code: it consumed until stopped)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert f"EHR client key {kid} " in lines[0] and "SVC_HMAC_KEY" in lines[0], lines
