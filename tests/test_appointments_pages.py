"""Appointment pages: the total comes with the page, and still when the page is past the end."""
from __future__ import annotations

import datetime as dt
import json
import threading
import urllib.parse
import urllib.request

import pytest

from lifecycle.users import create_user
from lifecycle.activation import set_activation_status
from lifecycle.verification import record_platform_verification
from helpers.bulk import sync_window_closed_now
from helpers.processes import wait_until
from helpers.rest import complete_snapshot, partner_headers
from models.appointments import SnapshotAppointment
from workers.snapshot import claim_build, publish

# The night never builds in a test's `serve`: inside the default 02:00-04:00 window its scheduler
# built the night the test publishes again, and held its `building` row (claim_build: None).
pytestmark = pytest.mark.svc_settings(sync_window=sync_window_closed_now())


@pytest.mark.gen_test
async def test_total_on_every_page_including_past_the_end(api, world, runtime):
    second = create_user(world.org.id, "doc2@example.com", "Second", "Doc", npi="1245319599")
    installation = record_platform_verification(runtime, world.app, world.physician)
    set_activation_status(runtime, installation, "Enabled", "test")  # a Disabled app reads no appointments
    complete_snapshot(runtime.clock, world.org, [world.physician, second], per_provider=12)  # only 12 are authorized
    headers = await partner_headers(api, world.app, world.secret)
    path = f"/v1/appointments/{world.org.id}"
    for offset, count in ((0, 5), (10, 2), (11, 1), (12, 0), (500, 0)):
        status, _, body = await api.call("GET", f"{path}?offset={offset}&limit=5", headers=headers)
        assert status == 200 and body["total"] == 12 and len(body["appointments"]) == count, (offset, body)
    # A provider who authorizes the app later is counted from then on.
    record_platform_verification(runtime, world.app, second)
    status, _, body = await api.call("GET", f"{path}?offset=30", headers=headers)
    assert (body["total"], body["appointments"]) == (24, [])


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_a_page_read_while_its_night_is_published_again_comes_from_one_snapshot(runtime, world, live):
    """A night built again (`snapshot run` for a night already published) replaces that night's
    snapshot. A page whose lookup of the latest snapshot came just before that publish, and whose
    page query just after, read a snapshot whose rows were gone: `total` 0 and no appointments
    (before), though the night had appointments all along. Over HTTP at a real `serve`: the page
    query is held on a lock while the night is published again, deterministically in that gap."""
    installation = record_platform_verification(runtime, world.app, world.physician)
    set_activation_status(runtime, installation, "Enabled", "test")
    first = complete_snapshot(runtime.clock, world.org, [world.physician], per_provider=6)
    body = urllib.parse.urlencode({"grant_type": "client_credentials", "client_id": world.app.client_id,
                                   "client_secret": world.secret}).encode()
    with urllib.request.urlopen(f"{live}/v1/oauth/token", data=body, timeout=30) as answer:
        token = json.loads(answer.read())["access_token"]

    def page() -> dict:
        request = urllib.request.Request(f"{live}/v1/appointments/{world.org.id}",
                                         headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            return json.loads(answer.read())

    assert page()["total"] == 6
    result = {}
    reader = threading.Thread(target=lambda: result.setdefault("page", page()))
    with runtime.db.atomic():
        runtime.db.execute_sql('LOCK TABLE "snapshot_appointment" IN ACCESS EXCLUSIVE MODE')
        reader.start()
        wait_until(lambda: runtime.db.execute_sql(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE NOT l.granted AND a.datname = current_database() "
            "AND l.relation = 'snapshot_appointment'::regclass").fetchone()[0] > 0,
            30, "the page query waiting on the lock (its lookup of the latest snapshot done)")
        again = claim_build(runtime, world.org.id, first.snapshot_date)
        start = dt.datetime.combine(first.snapshot_date, dt.time(9, 0)) + dt.timedelta(days=1)
        for n in range(4):
            SnapshotAppointment.create(
                snapshot=again, ehr_appointment_id=f"again-{n}", provider=world.physician.id,
                provider_npi=world.physician.npi or "0000000000", provider_name=world.physician.display_name,
                start=start + dt.timedelta(minutes=30 * n), end=start + dt.timedelta(minutes=30 * n + 20),
                status="booked", appointment_type="office_visit", reason="Follow-up", location="Room 1",
                patient_id=f"pat-again-{n}", patient_first_name="Pat", patient_last_name=f"Again{n}",
                patient_date_of_birth=dt.date(1980, 1, 1), patient_sex="female")
        publish(runtime, again)                 # the first snapshot's rows and row are deleted
    reader.join(60)
    assert not reader.is_alive()
    answered = result["page"]
    assert answered["total"] == 4 and [a["id"] for a in answered["appointments"]] == [f"again-{n}" for n in range(4)]
    assert answered["snapshot_date"] == first.snapshot_date.isoformat()
