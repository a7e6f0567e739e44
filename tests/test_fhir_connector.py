"""A clinic on a real FHIR R4 EHR (Medplum's FHIR engine behind SMART Backend Services tokens from
node-oidc-provider): connected with the CLI, its night built by `snapshot run`, its appointments
listed by the partner REST API, and the EHR's faults handled as the connector promises."""
from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from connectors import Provider, connector_for
from lifecycle.applications import install_application
from lifecycle.users import create_user
from lifecycle.verification import record_platform_verification
from models.directory import Organization
from workers.snapshot import COVERAGE, night_window

from conftest import settings_env
from fhir_support import appointment, fhir_ehr, patient, practitioner  # noqa: F401  (fixtures: fhir_ehr)
from rest_helpers import partner_headers

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
CLIENT_ID = "svc-auth-at-the-test-ehr"


def cli(settings, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.__main__", *args], env=settings_env(settings), cwd=str(ROOT),
                          capture_output=True, text=True, timeout=180)


def connect_clinic(settings, ehr, jwks_uri: str, name: str = "FHIR Clinic") -> str:
    """The operator's steps: register svc-auth at the EHR, then create the clinic on `fhir`."""
    ehr.admin("reset", {})
    ehr.register(CLIENT_ID, jwks_uri)
    done = cli(settings, "orgs", "create", "--name", name, "--ehr", "fhir", "--fhir-base-url", ehr.base,
               "--fhir-client-id", CLIENT_ID, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["id"]


def move_clock_to(clock, when: dt.datetime) -> None:
    clock.offset = 0.0
    clock.advance((when - clock.now()).total_seconds())


def eligible(runtime, app, user, when: dt.datetime) -> None:
    """The user completed the app's flow at `when` (the platform verified a token, which also
    opens their session in the hub)."""
    move_clock_to(runtime.clock, when)
    record_platform_verification(runtime, app, user)


async def listed(api, app, secret, org_id: str) -> list[dict]:
    headers, rows, offset = await partner_headers(api, app, secret), [], 0
    while True:
        status, _, body = await api.call("GET", f"/v1/appointments/{org_id}?offset={offset}&limit=50", headers=headers)
        assert status == 200, body
        rows += body["appointments"]
        offset += 50
        if offset >= body["total"]:
            return rows


@pytest.mark.gen_test(timeout=300)
async def test_the_night_of_a_fhir_clinic_lists_exactly_what_the_ehr_holds_for_its_active_physicians(
        api, runtime, world, live, fhir_ehr):
    settings = runtime.settings
    org_id = connect_clinic(settings, fhir_ehr, f"{live}/ehr/jwks.json")
    install_application(world.app.id, org_id)
    ana = create_user(org_id, "ana@fhir.example", "Ana", "Lopez", "alopez", "1417000001")
    ben = create_user(org_id, "ben@fhir.example", "Ben", "Okafor", "bokafor", "1417000019")
    cal = create_user(org_id, "cal@fhir.example", "Cal", "Nguyen", "cnguyen", "1417000027")  # not in the hub
    night = runtime.clock.now().date() + dt.timedelta(days=30)   # a night whose window the test chooses
    start, _ = night_window(settings, night)
    for user in (ana, ben):
        eligible(runtime, world.app, user, start - dt.timedelta(hours=10))   # in the hub the afternoon before
    eligible(runtime, world.app, cal, start - dt.timedelta(days=20))        # long ago: no session that night
    day = dt.timedelta(days=1)
    fhir_ehr.seed(
        practitioner("pr-ana", ana.npi, "Lopez", "Ana"), practitioner("pr-ben", ben.npi, "Okafor", "Ben"),
        practitioner("pr-cal", cal.npi, "Nguyen", "Cal"), practitioner("pr-x", "1417000035", "Other", "Xavier"),
        patient("pt-1", "Doe", "Jane", "1970-01-02", "female"), patient("pt-2", "Roe", "Rick", "1955-06-30", "male"),
        appointment("ana-booked", "pr-ana", "pt-1", start + day + dt.timedelta(hours=12)),
        appointment("ana-arrived", "pr-ana", "pt-2", start + 3 * day + dt.timedelta(hours=13), status="arrived"),
        appointment("ana-cancelled", "pr-ana", "pt-1", start + 4 * day, status="cancelled"),
        appointment("ana-noshow", "pr-ana", "pt-1", start + 4 * day + dt.timedelta(hours=1), status="noshow"),
        appointment("ana-after", "pr-ana", "pt-1", start + COVERAGE + dt.timedelta(hours=1)),
        appointment("ana-before", "pr-ana", "pt-1", start - dt.timedelta(hours=1)),
        appointment("cal-booked", "pr-cal", "pt-1", start + 2 * day),
        appointment("x-booked", "pr-x", "pt-2", start + 2 * day),
        # More than a page (100) of Ben's: the connector follows the Bundle's next links.
        *[appointment(f"ben-{n:03d}", "pr-ben", f"pt-{1 + n % 2}", start + dt.timedelta(hours=8 + n * 1.5))
          for n in range(130)])

    done = cli(settings, "snapshot", "run", "--date", night.isoformat(), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert org_id in json.loads(done.stdout)["built"], done.stderr

    rows = await listed(api, world.app, world.secret, org_id)
    expected = {"ana-booked", "ana-arrived", *[f"ben-{n:03d}" for n in range(130)]}
    assert sorted(r["id"] for r in rows) == sorted(expected)
    booked = next(r for r in rows if r["id"] == "ana-booked")
    assert booked["status"] == "booked" and booked["appointment_type"] == "Follow-up"
    assert booked["reason"] == "Hypertension follow-up" and booked["location"] == "Main Street Clinic"
    assert booked["provider"]["npi"] == ana.npi
    assert booked["patient"] == {"id": "pt-1", "first_name": "Jane", "last_name": "Doe",
                                 "date_of_birth": "1970-01-02", "sex": "female"}
    assert next(r for r in rows if r["id"] == "ana-arrived")["status"] == "arrived"

    check = cli(settings, "ehr", "check", "--org", org_id, "--json")
    verdict = json.loads(check.stdout)
    assert check.returncode == 0 and verdict["ok"], verdict
    assert [s["step"] for s in verdict["steps"]] == ["discovery", "token", "practitioner", "appointments"]


def test_ehr_faults_429_backoff_token_renewal_outage_and_a_revoked_registration(runtime, world, live, fhir_ehr):
    settings = runtime.settings
    org_id = connect_clinic(settings, fhir_ehr, f"{live}/ehr/jwks.json", name="Faulty Clinic")
    ana = create_user(org_id, "ana@faulty.example", "Ana", "Lopez", "alopez", "1417000043")
    start = dt.datetime.combine(runtime.clock.now().date(), dt.time(0, 0)) + dt.timedelta(days=1)
    fhir_ehr.seed(practitioner("pr-ana", ana.npi, "Lopez", "Ana"), patient("pt-1", "Doe", "Jane", "1970-01-02", "female"),
                  appointment("a-1", "pr-ana", "pt-1", start + dt.timedelta(hours=14)))
    provider = Provider(user_id=ana.id, npi=ana.npi, name="Ana Lopez")
    organization = Organization.get_by_id(org_id)

    def read() -> list[str]:
        return [a.id for a in connector_for(runtime, organization).fetch_appointments(provider, start, start + COVERAGE)]

    assert read() == ["a-1"]
    tokens = fhir_ehr.stats()["token"]

    # A 429 storm: each answer's Retry-After is waited out, then the read completes.
    fhir_ehr.fault(429, count=3, retry_after=0.4)
    began = time.monotonic()
    assert read() == ["a-1"]
    assert time.monotonic() - began >= 3 * 0.4
    assert fhir_ehr.stats()["faults"] >= 3

    # The EHR forgets svc-auth's token (a new token service): a 401, one new token, the read completes.
    fhir_ehr.register(CLIENT_ID, f"{live}/ehr/jwks.json")
    assert read() == ["a-1"]
    assert fhir_ehr.stats()["token"] == tokens + 1

    # The EHR down for a night: the run fails (retried later by the scheduler), then completes.
    night = runtime.clock.now().date() + dt.timedelta(days=30)
    install_application(world.app.id, org_id)
    eligible(runtime, world.app, ana, night_window(settings, night)[0] - dt.timedelta(hours=10))
    fhir_ehr.fault(503, count=1000)
    down = cli(settings, "snapshot", "run", "--date", night.isoformat(), "--json")
    assert down.returncode == 1 and "unavailable" in (down.stdout + down.stderr)
    fhir_ehr.fault(503, count=0)
    up = cli(settings, "snapshot", "run", "--date", night.isoformat(), "--json")
    assert up.returncode == 0, up.stderr

    # A revoked registration: a permanent failure that says what to fix.
    fhir_ehr.revoke()
    runtime.ehr_tokens.drop((f"{fhir_ehr.origin}/oauth/token", CLIENT_ID))
    check = cli(settings, "ehr", "check", "--org", org_id, "--json")
    verdict = json.loads(check.stdout)
    assert check.returncode == 1 and not verdict["ok"]
    token_step = next(s for s in verdict["steps"] if s["step"] == "token")
    assert not token_step["ok"] and CLIENT_ID in token_step["detail"] and "jwks" in token_step["detail"].lower()


def test_an_organization_on_fhir_needs_its_base_url_and_client_id(runtime):
    settings = runtime.settings
    missing = cli(settings, "orgs", "create", "--name", "No URL", "--ehr", "fhir", "--fhir-client-id", "x")
    assert missing.returncode == 2 and "--fhir-base-url" in missing.stderr
    no_client = cli(settings, "orgs", "create", "--name", "No client", "--ehr", "fhir",
                    "--fhir-base-url", "https://ehr.example/fhir/R4")
    assert no_client.returncode == 2 and "--fhir-client-id" in no_client.stderr
    open_server = cli(settings, "orgs", "create", "--name", "Open", "--ehr", "fhir",
                      "--fhir-base-url", "https://ehr.example/fhir/R4", "--fhir-auth", "none", "--json")
    assert open_server.returncode == 0, open_server.stderr
    assert json.loads(open_server.stdout)["fhir_auth"] == "none"


@pytest.mark.gen_test
async def test_the_ehr_jwks_publishes_the_public_half_only(api):
    status, headers, body = await api.call("GET", "/ehr/jwks.json")
    assert status == 200 and body["keys"] and headers["Access-Control-Allow-Origin"] == "*"
    assert all(k["alg"] == "RS384" and k["kty"] == "RSA" and "d" not in k for k in body["keys"])
