"""Billing rule (spec item 7): bill a user for a month when the platform verifies an access token
issued to the app for that user while the installation is `Enabled`; never while `Disabled`, and
at most once per (application, organization, user, month).

On the `free_trial` plan the 30-day trial itself is free: billing starts on day 31 (spec: "Free-trial
state": once the trial ended, a user the app keeps returning while `Enabled` is charged)."""
from __future__ import annotations

import re
from collections import OrderedDict

from peewee import JOIN, fn

from lifecycle.activation import is_billable_status
from models.billing import BillableUse
from models.directory import Organization, User
from billing.free_trial import trial_state
from errors import ApiError
from ops.csvcells import text_row

MONTH = re.compile(r"^[0-9]{4}-(0[1-9]|1[0-2])$")  # anchored for the OpenAPI document; matched whole


def is_billable(app, installation, now) -> bool:
    """`Enabled` in the organization, and not within a free trial."""
    if installation is None or not is_billable_status(installation.activation_status):
        return False
    return not trial_state(app.billing_plan, installation.trial_started_at, now).is_free_trial


def record_billable_use(app, user, installation, now) -> bool:
    """Add the ledger row if billable; True when this call created it.

    The unique index and INSERT ... ON CONFLICT DO NOTHING make concurrent verifications in any
    number of processes write one row. The row copies the clinic's name (in the same statement)
    and the user's email: the report prints them after the app, clinic or user is deleted."""
    if not is_billable(app, installation, now):
        return False
    clinic_name = (Organization.select(Organization.name)
                   .where(Organization.id == installation.organization_id))
    inserted = (BillableUse.insert(application_id=app.id, organization_id=installation.organization_id,
                                   user_id=user.id, month=now.strftime("%Y-%m"), first_verified_at=now,
                                   organization_name=clinic_name, user_email=user.email)
                .on_conflict_ignore().execute())
    return bool(inserted)


def parse_month(value) -> str:
    if not isinstance(value, str) or not MONTH.fullmatch(value):
        raise ApiError(400, "invalid_month", "month must look like YYYY-MM, e.g. 2026-11.")
    return value


def billing_report(month: str, application_id: str | None = None) -> dict:
    """Billable users per application and organization for `month`: every ledger row, whether the
    app, the clinic or the user still exists. Names are the current ones while the clinic and the
    user exist, else those copied when the use was billed (empty for a row the previous release
    wrote during a rolling upgrade whose clinic or user is gone since)."""
    month = parse_month(month)
    clinic_name = fn.COALESCE(Organization.name, BillableUse.organization_name, "")
    email = fn.COALESCE(User.email, BillableUse.user_email, "")
    query = (BillableUse.select(BillableUse.application_id, BillableUse.organization_id, BillableUse.user_id,
                                BillableUse.first_verified_at, clinic_name.alias("clinic_name"),
                                email.alias("email"))
             .join(Organization, JOIN.LEFT_OUTER, on=(BillableUse.organization_id == Organization.id))
             .switch(BillableUse).join(User, JOIN.LEFT_OUTER, on=(BillableUse.user_id == User.id))
             .where(BillableUse.month == month)
             .order_by(BillableUse.application_id, clinic_name, BillableUse.organization_id, email,
                       BillableUse.user_id))
    if application_id:
        query = query.where(BillableUse.application_id == application_id)
    groups: OrderedDict = OrderedDict()
    for row in query.dicts():
        key = (row["application_id"], row["organization_id"])
        group = groups.setdefault(key, {"application_id": row["application_id"],
                                        "organization_id": row["organization_id"],
                                        "organization_name": row["clinic_name"], "billable_users": 0, "users": []})
        group["billable_users"] += 1
        group["users"].append({"user_id": row["user_id"], "email": row["email"],
                               "first_verified_at": row["first_verified_at"].replace(microsecond=0).isoformat() + "Z"})
    organizations = list(groups.values())
    return {"month": month, "total_billable_users": sum(g["billable_users"] for g in organizations),
            "organizations": organizations}


def report_rows(report: dict) -> list[list[str]]:
    """The report flattened for CSV: one row per billable user (`ops.csvcells`: no cell a formula)."""
    rows = [["month", "application_id", "organization_id", "organization_name", "user_id", "email",
             "first_verified_at"]]
    for group in report["organizations"]:
        for user in group["users"]:
            rows.append(text_row([report["month"], group["application_id"], group["organization_id"],
                                  group["organization_name"], user["user_id"], user["email"],
                                  user["first_verified_at"]]))
    return rows
