"""What tokens and userinfo say about a user: ID token claims (with the free-trial state of
`billing.free_trial`), userinfo fields."""
from __future__ import annotations

import datetime as dt
from billing.free_trial import trial_state
from models.application import Application, Installation
from models.directory import Organization, User

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
