"""`keys rekey` killed half-way (PostgreSQL): after it resealed the disclosure chain, while it re-seals
the signing keys. A rerun finishes the job and nothing is lost: every count of `still_old` is 0,
`audit verify` passes without the old key, and `serve` starts without it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psycopg2
import pytest

from audit.disclosures import Disclosure, record
from helpers.environment import ROOT
from helpers.processes import free_port, settings_env, start_process, stop_process
from keys.totp import seal_totp
from models.developers import Developer
from models.disclosures import CHECKPOINT, DisclosureRecord

pytestmark = pytest.mark.svc_settings(own_keys=True)

OLD, NEW = "k" * 32, "n" * 40  # the session's SVC_HMAC_KEY (conftest) and the one it rotates to


def cli(env: dict, *args) -> tuple[int, dict, str]:
    result = subprocess.run([sys.executable, "-m", "cli.__main__", *args], env=env, cwd=str(ROOT),
                            capture_output=True, text=True, timeout=120)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout) if result.stdout.strip() else {}, result.stderr


def test_a_rekey_killed_while_it_reseals_the_keys_is_finished_by_a_rerun(backend, settings, runtime, tmp_path):
    if backend != "postgresql":
        pytest.skip("holds a PostgreSQL row lock to stop the rekey at a known statement")
    runtime.keyring.active  # noqa: B018  (the signing key, sealed under OLD)
    runtime.ehr_keys.current()  # the EHR client key, sealed under OLD
    dev = Developer.create(email="dev@example.com", password_hash="x", created_at=runtime.clock.now())
    Developer.update(totp_secret=seal_totp(runtime, dev.id, "JBSWY3DPEHPK3PXP")).where(Developer.id == dev.id).execute()
    for n in range(3):
        record(runtime, Disclosure("read", organization_id="org_k", resource_type="Patient", patients=(f"p{n}",)),
               "success", 200)
    step2 = settings_env(settings, SVC_HMAC_KEY=NEW, SVC_HMAC_KEY_PREVIOUS=OLD, SVC_VAR_DIR=tmp_path / "step2")
    holder = psycopg2.connect(settings.database_url)
    proc = None
    try:
        with holder.cursor() as cur:
            cur.execute('SELECT kid FROM "signing_key" FOR UPDATE')  # the rekey's UPDATE of it waits here
            proc = subprocess.Popen([sys.executable, "-m", "cli.__main__", "keys", "rekey", "--json"], env=step2,
                                    cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            deadline, waiting = time.monotonic() + 60, None
            while waiting is None and time.monotonic() < deadline and proc.poll() is None:
                cur.execute("SELECT pg_stat_clear_snapshot()")  # (a transaction sees one snapshot of the stats)
                cur.execute("SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                            "AND query LIKE 'UPDATE \"signing_key\"%'")
                row = cur.fetchone()
                waiting = row[0] if row else None
            assert waiting is not None, proc.communicate() if proc.poll() is not None else "it never waited"
            # Where the kill lands: the chain is resealed (committed), the signing key not yet.
            cur.execute('SELECT count(*) FROM "disclosure_record" WHERE "action" = %s', (CHECKPOINT,))
            assert cur.fetchone()[0] == 1
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
            cur.execute("SELECT pg_terminate_backend(%s)", (waiting,))  # the host is gone, and its session
        holder.rollback()
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        holder.close()
    assert proc.returncode == -signal.SIGKILL

    code, result, err = cli(step2, "keys", "rekey", "--json")
    assert code == 0 and "refused" not in result, (result, err)
    assert result["resealed"] >= 1 and set(result["still_old"].values()) == {0}, result
    new_only = settings_env(settings, SVC_HMAC_KEY=NEW, SVC_VAR_DIR=tmp_path / "new")
    code, verified, err = cli(new_only, "audit", "verify", "--json")
    assert code == 0 and verified["ok"] and verified["records"] == 4, (verified, err)
    assert DisclosureRecord.select().where(DisclosureRecord.action == CHECKPOINT).count() == 1
    port = free_port()  # every sealed key and secret opens, and the chain is vouched for, without OLD
    stop_process(start_process(["serve", "--port", str(port)], new_only, port, log_path=tmp_path / "serve.log"))
