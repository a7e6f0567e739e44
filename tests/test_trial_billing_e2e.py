"""Activation, free trial and billing as a whole, over HTTP with the clock moved (never slept).

- The trial starts when the app enables itself through the REST activation operation, and the ID
  token's `days_until_end_of_trial` counts whole UTC days through the real token endpoint.
- The spec's warning case: the trial ends; while the example app's records say "upgraded" it keeps
  returning the user and stays Enabled, so the platform's verification bills the user; once its
  records say "not upgraded" its token endpoint answers 403 `trial_expired`, the SDK never hands a
  token to the platform, and nothing is billed.
"""
from __future__ import annotations

import datetime as dt
import time

import pytest
from jose import jwt

from models.application import Installation
from helpers.partner_app import PARTNER_SETTINGS, LaunchTraffic, verify_on_platform
from helpers.rest import partner_headers

pytestmark = PARTNER_SETTINGS

YEAR = dt.datetime.now(dt.timezone.utc).year + 1


def set_clock(clock, when: dt.datetime) -> None:
    """Make the service clock read `when` (naive UTC) now. Dates lie ahead of the real clock: the
    example app checks token expiry against the real time, as any relying party would."""
    clock.offset = when.replace(tzinfo=dt.timezone.utc).timestamp() - time.time()


async def set_activation(api, app, secret, org_id, status) -> dict:
    headers = await partner_headers(api, app, secret)
    code, _, body = await api.call("PUT", f"/v1/applications/{app.id}/organizations/{org_id}/activation-status",
                                   {"status": status}, headers=headers)
    assert code == 200, body
    return body


async def billing(api, app, secret, month) -> dict:
    headers = await partner_headers(api, app, secret)
    code, _, body = await api.call("GET", f"/v1/applications/{app.id}/billing?month={month}", headers=headers)
    assert code == 200, body
    return {g["organization_id"]: [u["user_id"] for u in g["users"]] for g in body["organizations"]}


@pytest.mark.gen_test
async def test_days_until_end_of_trial_through_the_activation_and_token_endpoints(api, flow, world):
    app, org = world.app, world.org

    async def trial_claims():
        c = jwt.get_unverified_claims((await flow.tokens())["id_token"])
        return c["is_free_trial"], c["days_until_end_of_trial"]

    set_clock(api.runtime.clock, dt.datetime(YEAR, 3, 1, 23, 59, 30))  # to be activated 30 s before midnight UTC
    assert await trial_claims() == (True, None)      # installed, never enabled
    await verify_on_platform(api, flow, world)       # first SDK initialization: Disabled, not openable
    assert Installation.find(app.id, org.id).activation_status == "Disabled"
    # The clock runs on from where it was set, and the launches above take their time: set it again.
    set_clock(api.runtime.clock, dt.datetime(YEAR, 3, 1, 23, 59, 30))
    body = await set_activation(api, app, world.secret, org.id, "Enabled")
    started = body["trial_started_at"]  # 23:59:30, or a second or two later on a slow machine
    assert f"{YEAR}-03-01T23:59:30Z" <= started < f"{YEAR}-03-01T23:59:45Z", started
    assert await trial_claims() == (True, 30)        # day 1
    for when, expected in [
        (dt.datetime(YEAR, 3, 2, 0, 0, 1), (True, 29)),     # 31 seconds later, but a new UTC day
        (dt.datetime(YEAR, 3, 15, 12, 0), (True, 16)),
        (dt.datetime(YEAR, 3, 30, 23, 59, 59), (True, 1)),  # day 30, its last second
        (dt.datetime(YEAR, 3, 31, 0, 0, 0), (False, 0)),    # day 31: the trial has ended
        (dt.datetime(YEAR, 6, 1, 8, 0), (False, 0)),
    ]:
        set_clock(api.runtime.clock, when)
        assert await trial_claims() == expected, when
    # Disabling and enabling again does not restart the trial.
    await set_activation(api, app, world.secret, org.id, "Disabled")
    body = await set_activation(api, app, world.secret, org.id, "Enabled")
    assert body["trial_started_at"] == started
    assert await trial_claims() == (False, 0)
    # The other address variant never carries the billing claims.
    c = jwt.get_unverified_claims((await flow.tokens("/os-api/v2"))["id_token"])
    assert not {"is_free_trial", "days_until_end_of_trial", "application_billing_plan"} & set(c)


@pytest.mark.gen_test
async def test_trial_ended_app_keeps_returning_the_user_is_billed_then_403_is_not(api, partner, world, runtime):
    org = world.org
    p = partner(upgraded_organizations={org.id})  # the app's records: this clinic upgraded
    traffic = LaunchTraffic(api, p, world.physician, runtime)

    def launch_claims(outcome) -> tuple:
        c = jwt.get_unverified_claims(outcome["body"]["id_token"])
        return c["is_free_trial"], c["days_until_end_of_trial"]

    set_clock(api.runtime.clock, dt.datetime(YEAR, 3, 10, 9, 0))
    first = await traffic.one_launch()
    assert first["status"] == 200 and first["verified"]
    assert Installation.find(p.app.id, org.id).activation_status == "Disabled"
    await set_activation(api, p.app, p.secret, org.id, "Enabled")  # day 1 of the trial

    set_clock(api.runtime.clock, dt.datetime(YEAR, 4, 8, 18, 0))  # day 30: in the trial, verified, and free
    outcome = await traffic.one_launch()
    assert outcome["status"] == 200 and outcome["verified"] and launch_claims(outcome) == (True, 1)
    assert await billing(api, p.app, p.secret, f"{YEAR}-03") == {}
    assert await billing(api, p.app, p.secret, f"{YEAR}-04") == {}

    # Day 31: the trial has ended. The app's records say "upgraded", so it keeps returning the
    # user as authorized, and it stays Enabled: the platform's verification bills the user.
    set_clock(api.runtime.clock, dt.datetime(YEAR, 4, 9, 0, 0, 5))
    outcome = await traffic.one_launch()
    assert outcome["status"] == 200 and outcome["verified"] and launch_claims(outcome) == (False, 0)
    assert await billing(api, p.app, p.secret, f"{YEAR}-04") == {org.id: [world.physician.id]}
    again = await traffic.one_launch()  # the same month again: still one billable user
    assert again["verified"]
    assert await billing(api, p.app, p.secret, f"{YEAR}-04") == {org.id: [world.physician.id]}

    # A new month; the app's records now say "not upgraded": its token endpoint answers 403
    # trial_expired, the SDK never hands the token to the platform, nothing is billed.
    p.state.records.upgraded_organizations.discard(org.id)
    set_clock(api.runtime.clock, dt.datetime(YEAR, 5, 2, 10, 0))
    refused = await traffic.one_launch()
    assert refused["status"] == 403 and refused["body"]["error"] == "trial_expired" and refused["body"]["message"]
    assert refused["verified"] is False
    assert Installation.find(p.app.id, org.id).activation_status == "Enabled"  # still Enabled, still not billed
    assert await billing(api, p.app, p.secret, f"{YEAR}-05") == {}
    assert await billing(api, p.app, p.secret, f"{YEAR}-04") == {org.id: [world.physician.id]}  # unchanged
