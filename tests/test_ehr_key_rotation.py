"""svc-auth's EHR client key (SMART Backend Services) is rotated with `svc-auth ehr rotate-key`: the
new key signs the next assertion in every process, the previous one stays in /ehr/jwks.json for the
overlap (SVC_EHR_KEY_OVERLAP_SECONDS) and then leaves the database, private half included, at once
with `--finish`. Through the CLI in child processes, a real `serve` for /ehr/jwks.json, and real
token exchanges at the test EHR (node-oidc-provider, private_key_jwt)."""
from __future__ import annotations

import json
import time
import urllib.request

import pytest

from connectors.fhir.connector import connect, fhir_state
from models.directory import Organization
from models.ehr import EhrClientKey

from helpers.fhir_ehr import CLIENT_ID, connect_clinic


def served_kids(live: str) -> list[str]:
    with urllib.request.urlopen(f"{live}/ehr/jwks.json", timeout=10) as response:
        assert response.status == 200
        keys = json.loads(response.read())["keys"]
    assert all("d" not in k and k["alg"] == "RS384" for k in keys)  # public halves only
    return [k["kid"] for k in keys]


def stored_kids() -> set[str]:
    return {row.kid for row in EhrClientKey.select(EhrClientKey.kid)}


def audited(cli, action: str) -> list[dict]:
    return json.loads(cli("audit", "list", "--action", action, "--json").stdout)["events"]


def checked(cli, org_id: str) -> None:
    """`svc-auth ehr check`'s token step: a backend-services token from the EHR (a new process: no
    token cached)."""
    verdict = json.loads(cli("ehr", "check", "--org", org_id, "--json", expect=None).stdout)
    token = next(s for s in verdict["steps"] if s["step"] == "token")
    assert token["ok"], verdict


@pytest.fixture
def cli_any(settings):
    """`svc-auth ARGS...` as a child process; `expect=None` accepts any exit status."""
    import subprocess
    import sys
    from helpers.environment import ROOT
    from helpers.processes import settings_env

    def run(*args, expect=0):
        result = subprocess.run([sys.executable, "-m", "cli.__main__", *args], env=settings_env(settings),
                                cwd=str(ROOT), capture_output=True, text=True, timeout=120)
        assert expect is None or result.returncode == expect, result.stderr + result.stdout
        return result
    return run


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_rotate_key_signs_with_the_new_key_keeps_the_old_published_and_finish_drops_it(runtime, live, fhir_ehr,
                                                                                        cli_any):
    cli = cli_any
    org_id = connect_clinic(runtime.settings, fhir_ehr, f"{live}/ehr/jwks.json", name="Rotating Clinic")
    organization = Organization.get_by_id(org_id)

    # Before: one key, which signs (in this long-lived process and in a CLI process).
    [old] = served_kids(live)
    assert connect(runtime, organization).client.access_token()
    checked(cli, org_id)
    assert [a["kid"] for a in fhir_ehr.stats()["assertions"]] == [old, old]

    rotated = json.loads(cli("ehr", "rotate-key", "--json").stdout)
    new = rotated["kid"]
    assert new != old and rotated["previous_kid"] == old and rotated["signing_kid"] == new
    assert rotated["published"] == [new, old] and rotated["overlap_seconds"] == runtime.settings.ehr_key_overlap_seconds
    assert served_kids(live) == [new, old]                 # the running serve publishes both at once
    assert stored_kids() == {new, old}

    # The EHR's cached copy of the JWKS predates the new key (node-oidc-provider keeps it for its
    # max-age): it refuses the new kid, and the previous key, still published, gets the token.
    seen = len(fhir_ehr.stats()["assertions"])
    checked(cli, org_id)
    assert fhir_ehr.stats()["assertions"][seen:] == [{"kid": new, "ok": False}, {"kid": old, "ok": True}]

    # Once the EHR fetches the JWKS again, every assertion is the new key's: in a new CLI process and
    # in this process, which signed with the old key before (its token cache dropped: a token expired).
    fhir_ehr.register(CLIENT_ID, f"{live}/ehr/jwks.json")
    seen = len(fhir_ehr.stats()["assertions"])
    checked(cli, org_id)
    fhir_state(runtime).tokens.drop((f"{fhir_ehr.origin}/oauth/token", CLIENT_ID))
    assert connect(runtime, organization).client.access_token()
    assert fhir_ehr.stats()["assertions"][seen:] == [{"kid": new, "ok": True}, {"kid": new, "ok": True}]

    # --finish: the old key leaves the JWKS and the database (its private half with it).
    finished = json.loads(cli("ehr", "rotate-key", "--finish", "--json").stdout)
    assert finished["dropped"] == [old] and finished["published"] == [new] and finished["signing_kid"] == new
    assert served_kids(live) == [new]
    assert stored_kids() == {new}
    assert not EhrClientKey.select().where(EhrClientKey.kid == old).exists()
    fhir_ehr.register(CLIENT_ID, f"{live}/ehr/jwks.json")
    seen = len(fhir_ehr.stats()["assertions"])
    checked(cli, org_id)
    assert fhir_ehr.stats()["assertions"][seen:] == [{"kid": new, "ok": True}]

    # Audited like the other key commands.
    [event] = audited(cli, "ehr.key_rotated")
    assert event["subject"] == new and event["actor"] == "operator" and event["detail"]["previous_kid"] == old
    [event] = audited(cli, "ehr.key_dropped")
    assert event["subject"] == old and event["detail"]["reason"] == "rotate-key --finish"
    assert audited(cli, "ehr.key_rotation_finished")[0]["detail"]["dropped"] == [old]


@pytest.mark.svc_settings(ehr_key_overlap_seconds=2)
def test_after_the_overlap_the_old_key_leaves_the_jwks_and_the_database(runtime, live, cli_any):
    cli = cli_any
    [old] = served_kids(live)
    rotated = json.loads(cli("ehr", "rotate-key", "--json").stdout)
    new = rotated["kid"]
    assert served_kids(live) == [new, old] and stored_kids() == {new, old}
    # The old key's overlap ends 2 s (SVC_EHR_KEY_OVERLAP_SECONDS) after the new key's `created`, which
    # may be a second ahead of the clock (see test_a_rotation_reports_the_keys_whose_overlap_it_ended).
    overlap_ends = EhrClientKey.get(EhrClientKey.kid == new).created + 2
    time.sleep(max(0.0, overlap_ends - time.time()) + 0.2)
    assert served_kids(live) == [new]                         # the serve process drops it as it answers
    assert stored_kids() == {new}
    [event] = audited(cli, "ehr.key_dropped")
    assert event["subject"] == old and event["actor"] == "system" and event["detail"]["reason"] == "overlap over"
    # Without a JSON flag: `key: value` lines, as the other key commands print.
    assert "kid: " in cli("ehr", "rotate-key").stdout
    assert json.loads(cli("ehr", "rotate-key", "--finish", "--json").stdout)["published"] == served_kids(live)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_rotate_key_refuses_odd_input_with_exit_2_and_one_line(runtime, cli_any, settings):
    import subprocess
    import sys
    from helpers.environment import ROOT
    from helpers.processes import settings_env
    before = stored_kids()
    for args in (["ehr", "rotate-key", "now"], ["ehr", "rotate-key", "--overlap", "60"],
                 ["ehr", "rotate-key", "--finish=yes"]):
        refused = cli_any(*args, expect=2)
        # argparse's usage line, then one error line (every command's convention)
        *usage, error = refused.stderr.strip().splitlines()
        assert refused.stdout == "" and error.startswith("svc-auth") and ": error: " in error, refused.stderr
        assert all(line.startswith(("usage:", " ")) for line in usage), refused.stderr
    bad = subprocess.run([sys.executable, "-m", "cli.__main__", "ehr", "rotate-key", "--json"],
                         env=settings_env(settings, SVC_EHR_KEY_OVERLAP_SECONDS="-1"), cwd=str(ROOT),
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [
        "svc-auth: configuration error: SVC_EHR_KEY_OVERLAP_SECONDS must be 0 or more seconds, got '-1'"]
    assert stored_kids() == before                            # nothing rotated


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.svc_settings(ehr_key_overlap_seconds=2)
def test_a_rotation_reports_the_keys_whose_overlap_it_ended(runtime, cli_any):
    """A rotation after an earlier one's overlap deletes the oldest key and says so: `dropped` in its
    answer names it, and the published-until time is the one the JWKS keeps the previous key to."""
    cli = cli_any
    first = json.loads(cli("ehr", "rotate-key", "--json").stdout)
    assert first["dropped"] == []
    # The first key's overlap ends 2 s (SVC_EHR_KEY_OVERLAP_SECONDS) after its successor's `created`,
    # which may be a second ahead of the clock (a key added in the same second as the one before it
    # is numbered a second later): wait for that instant, not for 2 s (a fast start of the next
    # command then rotated inside the overlap, and dropped nothing).
    overlap_ends = EhrClientKey.get(EhrClientKey.kid == first["kid"]).created + 2
    time.sleep(max(0.0, overlap_ends - time.time()) + 0.2)
    second = json.loads(cli("ehr", "rotate-key", "--json").stdout)
    assert second["previous_kid"] == first["kid"]
    assert second["dropped"] == [first["previous_kid"]]       # the key the first rotation replaced
    assert second["published"] == [second["kid"], first["kid"]]
    assert stored_kids() == {second["kid"], first["kid"]}
    row = EhrClientKey.get(EhrClientKey.kid == second["kid"])
    until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(row.created + 2))
    assert second["previous_published_until"] == until
    [event] = [e for e in audited(cli, "ehr.key_rotated") if e["subject"] == second["kid"]]
    assert event["detail"]["dropped"] == [first["previous_kid"]]
