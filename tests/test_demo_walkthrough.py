"""The demo as the README and docs/rest-api.md walk it: the physician opens the app in the hub,
`svc-auth snapshot run` builds the coming night, the appointments API lists the physician's
appointments, and a chart request for the documented demo patient builds a real archive."""
from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys

import pyzipper
import pytest

from cli.demo_seed import DEMO_ORG_ID, DEMO_PHYSICIAN_ID, demo_patient, seed_demo
from models.application import Application
from models.directory import User

from helpers.charts import fetch_zip
from helpers.environment import ROOT
from helpers.hub import Hub
from helpers.processes import settings_env

pytestmark = pytest.mark.slow


def test_the_documented_demo_patient_is_in_the_docs():
    patient = demo_patient()
    assert patient.id == "pat-b15c092f2447b7a2"  # documented: it must never change
    assert patient.id in (ROOT / "docs" / "rest-api.md").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "svc-auth snapshot run" in readme and patient.id in readme


@pytest.mark.gen_test(timeout=120)
async def test_demo_appointments_after_snapshot_run_and_a_chart_of_the_demo_patient(api, runtime):
    info = seed_demo(runtime)
    app = Application.get_by_id(info["application_id"])
    physician = Hub(api, runtime, app, info["client_secret"], User.get_by_id(DEMO_PHYSICIAN_ID))
    await physician.complete_flow()   # what opening the app in the hub does

    result = subprocess.run([sys.executable, "-m", "cli.__main__", "snapshot", "run", "--json"],
                            env=settings_env(runtime.settings), cwd=str(ROOT), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    ran = json.loads(result.stdout)
    assert ran["organizations"][DEMO_ORG_ID] > 0, ran

    status, _, token = await api.call("POST", "/v1/oauth/token", {
        "grant_type": "client_credentials", "client_id": info["client_id"], "client_secret": info["client_secret"]})
    assert status == 200, token
    auth = {"Authorization": f"Bearer {token['access_token']}"}
    # docs/rest-api.md step 4: the first launch left the app Disabled; it enables itself to read the clinic.
    status, _, enabled = await api.call("PUT", f"/v1/applications/{app.id}/organizations/{DEMO_ORG_ID}/activation-status",
                                        {"status": "Enabled"}, headers=auth)
    assert status == 200, enabled
    status, _, page = await api.call("GET", f"/v1/appointments/{DEMO_ORG_ID}?limit=50", headers=auth)
    assert status == 200 and page["total"] == ran["organizations"][DEMO_ORG_ID] and page["snapshot_date"] == ran["snapshot_date"]
    assert {a["provider"]["user_id"] for a in page["appointments"]} == {DEMO_PHYSICIAN_ID}

    patient = demo_patient()
    status, _, created = await api.call("POST", "/v1/chart-retrieval/requests",
                                        {"svc_organization_id": DEMO_ORG_ID, "patient_id": patient.id}, headers=auth)
    assert status == 202, created
    for _ in range(200):
        status, _, body = await api.call("GET", f"/v1/chart-retrieval/requests/{created['request_id']}", headers=auth)
        if body["status"] != "pending":
            break
        await asyncio.sleep(0.1)
    assert body["status"] == "ready", body
    status, _, url = await api.call("GET", f"/v1/chart-retrieval/download-url/{created['request_id']}", headers=auth)
    assert status == 200, url
    response = await fetch_zip(api, url["download_url"], runtime)
    with pyzipper.AESZipFile(io.BytesIO(response.body)) as archive:
        archive.setpassword(info["application_id"].encode())
        chart = json.loads(archive.read(f"{created['request_id']}.json"))
    assert chart["patient"]["id"] == patient.id and chart["patient"]["last_name"] == patient.last_name
