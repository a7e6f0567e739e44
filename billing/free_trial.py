"""The free trial (spec: "Free trial"): 30 whole UTC days of one installation, from its first
`Enabled`; its state is what the ID token's three billing claims say.

- `trial_state`: the spec's four states (paid; trial not started; N days left; ended).
- `start_trial`: the first `Enabled` of an installation starts it (never restarted), even when two
  requests race (`lifecycle.activation` calls it in its transaction).
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from models.application import Installation

TRIAL_DAYS = 30


@dataclass(frozen=True)
class TrialState:
    """The spec's four free-trial states, as the three ID token claims."""

    application_billing_plan: str
    is_free_trial: bool
    days_until_end_of_trial: int | None

    def claims(self) -> dict:
        return {"application_billing_plan": self.application_billing_plan,
                "is_free_trial": self.is_free_trial,
                "days_until_end_of_trial": self.days_until_end_of_trial}


def trial_state(plan: str, trial_started_at: dt.datetime | None, now: dt.datetime) -> TrialState:
    """Free-trial state of an installation.

    The trial lasts 30 whole UTC days counting the day of the first activation as day 1: on day 1
    30 days remain, on day 30 one remains, from day 31 on the trial has ended.
    """
    if plan != "free_trial":
        return TrialState(plan, False, None)
    if trial_started_at is None:
        return TrialState(plan, True, None)
    today = now.date()
    left = TRIAL_DAYS - (today - trial_started_at.date()).days
    if left > 0:
        return TrialState(plan, True, min(left, TRIAL_DAYS))
    return TrialState(plan, False, 0)


def start_trial(installation_id: int, now: dt.datetime) -> None:
    """Start the installation's trial at `now` unless it started before (only the first Enabled)."""
    (Installation.update(trial_started_at=now)
     .where((Installation.id == installation_id) & Installation.trial_started_at.is_null()).execute())
