"""Free-trial claims follow the spec's four-state table, by whole UTC days."""
import datetime as dt

import pytest
from jose import jwt

from models.application import Application, Installation
from billing.free_trial import TRIAL_DAYS, trial_state

START = dt.datetime(2026, 3, 1, 23, 59)  # late in the day: days count by UTC date, not 24 h spans


def on_day(n: int, hour: int = 12) -> dt.datetime:
    """Day n of the trial (day 1 is the day of the first activation)."""
    return dt.datetime(2026, 3, 1, hour) + dt.timedelta(days=n - 1)


def test_not_a_trial_plan():
    assert trial_state("paid", None, START).claims() == {
        "application_billing_plan": "paid", "is_free_trial": False, "days_until_end_of_trial": None}
    assert trial_state("paid", START, on_day(40)).is_free_trial is False


def test_trial_not_started():
    assert trial_state("free_trial", None, START).claims() == {
        "application_billing_plan": "free_trial", "is_free_trial": True, "days_until_end_of_trial": None}


@pytest.mark.parametrize("day,left", [(1, 30), (2, 29), (15, 16), (29, 2), (30, 1)])
def test_in_trial_counts_down_by_whole_days(day, left):
    state = trial_state("free_trial", START, on_day(day))
    assert (state.is_free_trial, state.days_until_end_of_trial) == (True, left)


def test_day_boundary_is_midnight_utc():
    assert trial_state("free_trial", START, dt.datetime(2026, 3, 2, 0, 0, 1)).days_until_end_of_trial == 29
    assert trial_state("free_trial", START, dt.datetime(2026, 3, 1, 23, 59, 59)).days_until_end_of_trial == 30


@pytest.mark.parametrize("day", [31, 32, 400])
def test_trial_ended_from_day_31(day):
    state = trial_state("free_trial", START, on_day(day, hour=0))
    assert (state.is_free_trial, state.days_until_end_of_trial) == (False, 0)


@pytest.mark.gen_test
async def test_id_token_walks_the_trial_through_http(flow, world, runtime):
    """Not started -> day 1 -> day 30 -> day 31, with the service clock moved, not slept."""
    async def claims():
        token = (await flow.tokens())["id_token"]
        c = jwt.get_unverified_claims(token)
        return c["is_free_trial"], c["days_until_end_of_trial"]

    assert await claims() == (True, None)
    now = runtime.clock.now()
    Installation.update(trial_started_at=now, activation_status="Enabled").where(
        Installation.application == world.app.id).execute()
    assert await claims() == (True, TRIAL_DAYS)
    midnight_after = dt.datetime.combine(now.date() + dt.timedelta(days=1), dt.time())
    runtime.clock.advance((midnight_after - now).total_seconds() + (TRIAL_DAYS - 2) * 86400 + 60)  # day 30
    assert await claims() == (True, 1)
    runtime.clock.advance(86400)  # day 31
    assert await claims() == (False, 0)


@pytest.mark.gen_test
async def test_paid_plan_claims(flow, world):
    Application.update(billing_plan="paid").where(Application.id == world.app.id).execute()
    c = jwt.get_unverified_claims((await flow.tokens())["id_token"])
    assert (c["application_billing_plan"], c["is_free_trial"], c["days_until_end_of_trial"]) == ("paid", False, None)
