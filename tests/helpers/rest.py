"""Helpers of the REST API tests: a partner token over HTTP, and a nightly snapshot as the worker leaves it."""
from __future__ import annotations

import datetime as dt

from models.appointments import Snapshot, SnapshotAppointment


async def partner_headers(api, app, secret) -> dict:
    status, _, body = await api.call("POST", "/v1/oauth/token", {
        "grant_type": "client_credentials", "client_id": app.client_id, "client_secret": secret})
    assert status == 200, body
    return {"Authorization": f"Bearer {body['access_token']}"}


def complete_snapshot(clock, org, providers, per_provider=3, day=None) -> Snapshot:
    """A complete snapshot of `org` with `per_provider` appointments for each provider, some at equal times."""
    day = day or clock.now().date()
    snap = Snapshot.create(organization=org.id, snapshot_date=day, status="complete", completed_at=clock.now())
    base = dt.datetime.combine(day, dt.time(9, 0))
    for p_index, provider in enumerate(providers):
        for n in range(per_provider):
            start = base + dt.timedelta(days=1 + n % 3, minutes=30 * (n // 3))  # equal starts across providers
            SnapshotAppointment.create(
                snapshot=snap, ehr_appointment_id=f"ehr-{provider.id}-{n}", provider=provider.id,
                provider_npi=provider.npi or "0000000000", provider_name=provider.display_name, start=start,
                end=start + dt.timedelta(minutes=20), status="booked", appointment_type="office_visit",
                reason="Follow-up", location="Room 1", patient_id=f"pat-{p_index}-{n}", patient_first_name="Pat",
                patient_last_name=f"Ient{n}", patient_date_of_birth=dt.date(1980, 1, 1 + n % 28), patient_sex="female")
    return snap
