"""What tokens and userinfo say about a user: ID token claims, free-trial state, userinfo fields."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from models.application import Application, Installation
from models.directory import Organization, User

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


def id_token_claims(app: Application, user: User, installation: Installation | None,
                    with_billing: bool, now: dt.datetime, nonce: str | None = None) -> dict:
    """Identity claims of the ID token at `now` (registered claims are added when signing)."""
    claims = {"email": user.email}
    if user.given_name:
        claims["given_name"] = user.given_name
    if user.family_name:
        claims["family_name"] = user.family_name
    if nonce:
        claims["nonce"] = nonce
    if with_billing:
        started = installation.trial_started_at if installation else None
        claims.update(trial_state(app.billing_plan, started, now).claims())
    return claims


def userinfo_claims(app: Application, user: User, organization: Organization, namespace: str) -> dict:
    """UserInfo: `sub` always; other fields only where the app declared read access."""
    fields = set(app.user_fields or ())
    info = {"sub": user.id}
    if "email" in fields:
        info["email"] = user.email
    if "name" in fields:
        if user.given_name:
            info["given_name"] = user.given_name
        if user.family_name:
            info["family_name"] = user.family_name
    if "ehrUsername" in fields and user.ehr_username:
        info[f"https://{namespace}/ehrUsername"] = user.ehr_username
    if "organization" in fields:
        info[f"https://{namespace}/organization"] = {"id": organization.id, "name": organization.name}
    return info
