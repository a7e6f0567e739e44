"""`GET /v1/applications/{applicationId}/billing?month=YYYY-MM`: the caller's own billing ledger.

The same numbers as `svc-auth billing report --app`, from `lifecycle.billing.billing_report`:
users billed for the month (UTC), grouped per organization.
"""
from __future__ import annotations

from lifecycle.billing import billing_report
from models.application import Application
from partner_api.access import own_application


def billing_of(app: Application, month: str | None) -> dict:
    """Billable users of `app` per organization for `month` (400 `invalid_month` when malformed)."""
    report = billing_report(month, app.id)
    organizations = [{key: group[key] for key in ("organization_id", "organization_name", "billable_users", "users")}
                     for group in report["organizations"]]
    return {"application_id": app.id, "month": report["month"],
            "total_billable_users": report["total_billable_users"], "organizations": organizations}


def own_billing(app: Application, application_id: str, month: str | None) -> dict:
    """`billing_of` for the path's applicationId, which must be the caller's own."""
    return billing_of(own_application(app, application_id), month)
