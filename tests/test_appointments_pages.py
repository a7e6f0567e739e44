"""Appointment pages: the total comes with the page, and still when the page is past the end."""
from __future__ import annotations

import pytest

from lifecycle.users import create_user
from lifecycle.activation import set_activation_status
from lifecycle.verification import record_platform_verification
from helpers.rest import complete_snapshot, partner_headers


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
