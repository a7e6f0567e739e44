"""Connector sessions come from the platform, and the sandbox EHR lives: the whole path end to end.

Physicians use the hub over HTTP (launch, authorize, token, platform verification, the hub's
poll); then the night passes for real: `svc-auth scheduler` and `svc-auth worker` processes are
started under a clock moved to the sync window (test-only SVC_CLOCK_OFFSET) and build the
snapshot; `GET /v1/appointments/{org}` then shows who the rule lets in. A second night, run by
processes restarted a day later, shows the sandbox's new bookings and cancellations with the
spec's 24-hour lag.
"""
from __future__ import annotations

import datetime as dt

import pytest

from connectors import Provider
from connectors.sandbox import SandboxConnector
from lifecycle.applications import install_application
from lifecycle.organizations import create_organization
from lifecycle.users import create_user
from hub.sandbox import end_sandbox_session, open_sandbox_session
from models.application import Authorization
from models.appointments import ConnectorSession, Snapshot
from models.directory import Organization
from workers.snapshot import COVERAGE, night_window

from helpers.hub import Hub
from helpers.processes import settings_env, start_process, stop_process, wait_until
from helpers.rest import partner_headers


ORG_ID = "org_e2e_sessions"     # fixed, with the fixed dates below: the sandbox's answers are known
IN_HUB = dt.datetime(2030, 3, 5, 15, 0)   # a Tuesday afternoon: physicians use the hub
NIGHT = dt.date(2030, 3, 6)                # that night's sync (window 02:00-04:00 UTC)
TTL = 3 * 24 * 3600
pytestmark = [pytest.mark.slow, pytest.mark.svc_settings(redis=True, connector_session_ttl=TTL)]


def move_clock_to(clock, when: dt.datetime) -> None:
    clock.offset = 0.0
    clock.advance((when - clock.now()).total_seconds())


def offset_to(when: dt.datetime) -> float:
    return (when - dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)).total_seconds()


def pass_the_night(settings, night: dt.date, tmp_path) -> Snapshot:
    """A scheduler and a worker, started with their clock in `night`'s sync window, build it."""
    window_start, _ = night_window(settings, night)
    env = settings_env(settings, SVC_CONNECTOR_SESSION_TTL=TTL,
                       SVC_CLOCK_OFFSET=offset_to(window_start + dt.timedelta(seconds=30)))
    procs = [start_process(["scheduler", "--interval", "0.2"], env, log_path=tmp_path / f"scheduler-{night}.log"),
             start_process(["worker", "--threads", "2"], env, log_path=tmp_path / f"worker-{night}.log")]
    try:
        return wait_until(lambda: (s := Snapshot.latest_complete(ORG_ID)) and s.snapshot_date == night and s,
                          what=f"the snapshot of {night}")
    finally:
        for proc in procs:
            assert stop_process(proc) == 0


async def all_appointments(api, org_id, headers) -> tuple[list[dict], str]:
    rows, offset = [], 0
    while True:
        status, _, body = await api.call("GET", f"/v1/appointments/{org_id}?offset={offset}&limit=50", headers=headers)
        assert status == 200, body
        rows += body["appointments"]
        offset += 50
        if offset >= body["total"]:
            assert len(rows) == body["total"]
            return rows, body["snapshot_date"]


def ehr_ids(user, night, settings, as_of=None) -> set[str]:
    """What the sandbox EHR holds for `user` over `night`'s 10 days (as of the sync, or `as_of`)."""
    start, _ = night_window(settings, night)
    provider = Provider(user_id=user.id, npi=user.npi, name=user.display_name)
    organization = Organization.get_by_id(ORG_ID)
    connector = SandboxConnector(organization.id, organization.name, organization.ehr_url)
    return {a.id for a in connector.fetch_appointments(provider, start, start + COVERAGE, as_of)}


@pytest.mark.gen_test(timeout=300)
async def test_the_night_reads_for_physicians_active_in_the_hub_and_the_sandbox_schedule_lives(
        api, runtime, world, tmp_path):
    settings = runtime.settings
    app, secret = world.app, world.secret
    org = create_organization("Sessions Clinic", "sandbox", "https://ehr.example/sessions", org_id=ORG_ID)
    install_application(app.id, org.id)
    users = {name: create_user(org.id, f"{name}@sessions.example", name.title(), "Doc", name, npi)
             for name, npi in [("active", "1003000100"), ("never", "1003000118"), ("nonpi", None),
                               ("unfinished", "1003000126"), ("expired", "1003000134"), ("signedout", "1003000142")]}

    # Four days before: `expired` used the app in the hub; their session lapses before the night.
    move_clock_to(runtime.clock, IN_HUB - dt.timedelta(days=4))
    await Hub(api, runtime, app, secret, users["expired"]).complete_flow()
    # That first SDK initialization left the app Disabled in the clinic; the app enables itself.
    status, _, body = await api.call("PUT", f"/v1/applications/{app.id}/organizations/{org.id}/activation-status",
                                     {"status": "Enabled"}, headers=await partner_headers(api, app, secret))
    assert status == 200, body
    # The afternoon before the night.
    move_clock_to(runtime.clock, IN_HUB)
    await Hub(api, runtime, app, secret, users["active"]).complete_flow()
    await Hub(api, runtime, app, secret, users["nonpi"]).complete_flow()
    await Hub(api, runtime, app, secret, users["unfinished"]).open_app()   # never verified by the platform
    session = open_sandbox_session(runtime, users["signedout"])       # signed in to the sandbox EHR
    await Hub(api, runtime, app, secret, users["signedout"]).complete_flow()
    end_sandbox_session(runtime, session)                              # ... and signed out (POST /sandbox/signout)
    # `never` completed the app's flow long ago (an authorization), but was never in the hub.
    Authorization.create(application=app.id, user=users["never"].id, first_verified_at=IN_HUB - dt.timedelta(days=90),
                         last_verified_at=IN_HUB - dt.timedelta(days=90))
    assert not ConnectorSession.select().where(ConnectorSession.user == users["never"].id).exists()
    # Staying in the hub keeps the session alive without a write per poll.
    active_session = ConnectorSession.get(ConnectorSession.user == users["active"].id)
    active_hub = Hub(api, runtime, app, secret, users["active"])
    runtime.clock.advance(10)
    await active_hub.poll()
    assert ConnectorSession.get_by_id(active_session.id).last_seen_at == active_session.last_seen_at
    runtime.clock.advance(120)
    await active_hub.poll()
    assert ConnectorSession.get_by_id(active_session.id).last_seen_at > active_session.last_seen_at
    assert ConnectorSession.select().where(ConnectorSession.user == users["active"].id).count() == 1

    # The night passes: a real scheduler and worker, started in the sync window.
    pass_the_night(settings, NIGHT, tmp_path)
    move_clock_to(runtime.clock, dt.datetime.combine(NIGHT, dt.time(9, 0)))
    headers = await partner_headers(api, app, secret)
    rows, snapshot_date = await all_appointments(api, org.id, headers)
    assert snapshot_date == NIGHT.isoformat()
    assert {r["provider"]["user_id"] for r in rows} == {users["active"].id}
    assert {r["provider"]["npi"] for r in rows} == {"1003000100"}
    window_start, _ = night_window(settings, NIGHT)
    assert all(window_start <= dt.datetime.fromisoformat(r["start"][:-1]) < window_start + COVERAGE for r in rows)
    first_night = {r["id"] for r in rows}
    assert first_night == ehr_ids(users["active"], NIGHT, settings)

    # Meanwhile the EHR changes: bookings made and appointments cancelled during the day after the sync.
    next_night = NIGHT + dt.timedelta(days=1)
    later = ehr_ids(users["active"], next_night, settings)
    covered_twice = ehr_ids(users["active"], next_night, settings, as_of=window_start)  # next range, as of this night
    booked, cancelled = later - covered_twice, covered_twice - later
    assert booked and cancelled, "the sandbox books and cancels appointments every day"
    assert cancelled <= first_night and not booked & first_night

    # 24-hour lag: late that day the API still serves the morning's snapshot.
    move_clock_to(runtime.clock, dt.datetime.combine(NIGHT, dt.time(23, 0)))
    rows, _ = await all_appointments(api, org.id, await partner_headers(api, app, secret))
    assert {r["id"] for r in rows} == first_night

    # The next night (processes restarted a day later) picks the changes up.
    pass_the_night(settings, next_night, tmp_path)
    move_clock_to(runtime.clock, dt.datetime.combine(next_night, dt.time(9, 0)))
    rows, snapshot_date = await all_appointments(api, org.id, await partner_headers(api, app, secret))
    second_night = {r["id"] for r in rows}
    assert snapshot_date == next_night.isoformat() and second_night == later
    assert booked <= second_night and not cancelled & second_night
