"""Retention (workers.retention) over real HTTP on both databases: launches, codes, grants and refresh
tokens made by SMART launches, and sign-in links, sessions and invitations made by their flows; the
clock moved past their lifetimes, the scheduler's tick run as the scheduler runs it, and what can no
longer matter is gone while the replay detections, the audit's jti look-up and `last_launch_at` keep
what they need."""
from __future__ import annotations

import datetime as dt
import urllib.parse

import pytest
from jose import jwt

from console.accounts import invite_developer
from helpers.console import ConsoleClient
from helpers.hub import sandbox_signin
from helpers.rest import partner_headers
from helpers.smart import KIT_SCOPE, VERIFIER, SmartClient
from lifecycle.applications import set_offline_access_ttl
from models.application import DEFAULT_SMART_SCOPES
from models.audit import AuditEvent
from models.developers import ConsoleSession, DeveloperInvite
from models.disclosures import DisclosureRecord
from models.grants import AuthorizationCode, Launch
from models.invitations import Invitation
from models.refresh import RefreshToken, SmartGrant
from models.sandbox import SandboxSession, SandboxSigninLink
from workers.retention import margin, sweep_retention
from workers.scheduler import tick_and_sweep

DAY = 24 * 3600
PASSWORD = "correct horse battery staple"
NO_REFRESH_SCOPE = "launch openid fhirUser patient/*.read"


@pytest.fixture
def retention_app(api, runtime, world):
    """A confidential SMART app that may ask for offline_access, launched by the world's physician."""
    smart = world.smart(runtime, DEFAULT_SMART_SCOPES + " offline_access")
    return SmartClient(api, smart.app, smart.secret, smart.world.sandbox_token, smart.org.id)


def jti(token: str) -> str:
    return jwt.get_unverified_claims(token)["jti"]


def grant_of(refresh_token_response: dict) -> SmartGrant:
    first = RefreshToken.get(RefreshToken.access_jti == jti(refresh_token_response["access_token"]))
    return SmartGrant.get_by_id(first.grant_id)


def code_of(token_response: dict) -> AuthorizationCode:
    return AuthorizationCode.get(AuthorizationCode.issued_jtis == jti(token_response["access_token"]))


async def exchange(client: SmartClient, code: str) -> tuple[int, dict]:
    return await client.token({"grant_type": "authorization_code", "code": code,
                               "redirect_uri": client.app.redirect_uri, "code_verifier": VERIFIER})


@pytest.mark.gen_test(timeout=120)
async def test_ended_grants_spent_codes_and_old_launches_go_and_replays_are_still_detected(
        retention_app, runtime, clock, settings):
    client = retention_app
    # Revoked after a refresh loop: every row of it can go.
    revoked = await client.tokens(KIT_SCOPE)
    token = revoked["refresh_token"]
    for _ in range(3):
        status, answer = await client.refresh(token)
        assert status == 200, answer
        token = answer["refresh_token"]
    revoked_grant, revoked_code = grant_of(revoked), code_of(revoked)
    assert await client.revoke(token) == 200
    # Revoked too, but one of its access tokens read a patient: the audit's look-up keeps that row.
    audited = await client.tokens(KIT_SCOPE)
    status, refreshed = await client.refresh(audited["refresh_token"])
    assert status == 200, refreshed
    status, _ = await client.read_patient(refreshed["access_token"])
    assert status == 200
    audited_grant = grant_of(audited)
    assert await client.revoke(refreshed["refresh_token"]) == 200
    # No refresh token: the code is spent once its access token has expired.
    plain = await client.tokens(NO_REFRESH_SCOPE)
    plain_code = code_of(plain)
    # Live grants: one whose spent token will be replayed, one whose code will be.
    live = await client.tokens(KIT_SCOPE)
    status, live_next = await client.refresh(live["refresh_token"])
    assert status == 200, live_next
    answer = await client.authorize(KIT_SCOPE)
    status, code_live = await exchange(client, answer["code"])
    assert status == 200, code_live
    never_used = await client.launch()  # the newest launch of this app and user
    launches = Launch.select().count()
    assert launches == 6

    clock.advance(2 * DAY)
    tick_and_sweep(runtime)

    assert not SmartGrant.select().where(SmartGrant.id == revoked_grant.id).exists()
    assert not RefreshToken.select().where(RefreshToken.grant == revoked_grant.id).exists()
    assert not AuthorizationCode.select().where(
        AuthorizationCode.code_hash.in_([revoked_code.code_hash, plain_code.code_hash])).exists()
    # The audit's query (docs/audit.md) still leads from the disclosure record to the grant and launch.
    record = DisclosureRecord.get(DisclosureRecord.jti == jti(refreshed["access_token"]))
    kept = RefreshToken.select().where(RefreshToken.grant == audited_grant.id)
    assert [r.access_jti for r in kept] == [record.jti]
    assert SmartGrant.get_by_id(audited_grant.id).launch_id == audited_grant.launch_id
    # Launches: those of the live grants' codes and the newest one stay; the other three go.
    kept_launches = {launch.id for launch in Launch.select()}
    assert never_used in kept_launches and len(kept_launches) == 3, kept_launches
    assert grant_of(live).launch_id in kept_launches and grant_of(code_live).launch_id in kept_launches

    # The replay detections still work on what was kept: a spent refresh token revokes its grant...
    status, body = await client.refresh(live["refresh_token"])
    assert status == 400 and "already used" in body["error_description"], body
    assert SmartGrant.get_by_id(grant_of(live).id).revoked_reason == "refresh_token_replayed"
    status, body = await client.refresh(live_next["refresh_token"])
    assert status == 400 and body["error"] == "invalid_grant"
    # ... and a replayed code revokes the grant its first use started.
    status, body = await exchange(client, answer["code"])
    assert status == 400 and "already used" in body["error_description"], body
    assert SmartGrant.get_by_id(grant_of(code_live).id).revoked_reason == "code_replayed"
    status, body = await client.refresh(code_live["refresh_token"])
    assert status == 400 and body["error"] == "invalid_grant"


@pytest.mark.gen_test(timeout=120)
async def test_a_grant_ended_within_the_margin_keeps_its_rows_and_its_code_still_revokes(
        retention_app, runtime, clock):
    """A grant that expired (not revoked) an hour ago still has access tokens that may be live: a
    replay of its code must still find the grant and deny them, so nothing of it is swept yet."""
    client = retention_app
    set_offline_access_ttl(runtime, client.app.id, 3600)
    answer = await client.authorize(KIT_SCOPE)
    status, tokens = await exchange(client, answer["code"])
    assert status == 200, tokens
    grant = grant_of(tokens)

    clock.advance(2 * 3600)  # the grant expired an hour ago
    tick_and_sweep(runtime)
    assert RefreshToken.select().where(RefreshToken.grant == grant.id).exists()
    assert AuthorizationCode.select().where(AuthorizationCode.code_hash == code_of(tokens).code_hash).exists()

    status, body = await exchange(client, answer["code"])
    assert status == 400 and "already used" in body["error_description"], body
    assert SmartGrant.get_by_id(grant.id).revoked_reason == "code_replayed"


@pytest.mark.gen_test(timeout=120)
async def test_expired_links_invitations_and_sessions_go_after_their_margins(api, http_client, base_url, runtime,
                                                                             clock, world):
    headers = await partner_headers(api, world.app, world.secret)
    status, _, invited = await api.call("POST", "/v1/invitations", {
        "email": "late@clinic.example", "organization_name": "Late Clinic", "given_name": "Lee",
        "family_name": "Late"}, headers=headers)
    assert status == 201, invited
    await sandbox_signin(api, runtime, world.physician.id)  # a used sign-in link and a hub session
    console = ConsoleClient(http_client, base_url)  # a used console invitation and a console session
    _, url, _ = invite_developer(runtime, world.app.id, "dev@partner.example")
    path = urllib.parse.urlsplit(url).path
    assert (await console.get(path)).code == 200
    assert (await console.post(path, {"password": PASSWORD, "confirm": PASSWORD})).code == 303, console.last_html
    assert (await console.sign_in("dev@partner.example", PASSWORD)).code == 303, console.last_html
    invite_developer(runtime, world.app.id, "never@partner.example")  # never opened
    assert Invitation.select().count() == SandboxSigninLink.select().count() == 1
    assert DeveloperInvite.select().count() == 2
    assert SandboxSession.select().count() == ConsoleSession.select().count() == 1

    clock.advance(10 * DAY)  # sessions long idle or expired; links expired, but a late click is still told so
    tick_and_sweep(runtime)
    assert SandboxSession.select().count() == ConsoleSession.select().count() == 0
    assert Invitation.select().count() == SandboxSigninLink.select().count() == 1
    assert DeveloperInvite.select().count() == 2
    token = urllib.parse.urlsplit(invited["invitation_url"]).path.rsplit("/", 1)[1]
    status, _, body = await api.call("GET", f"/invitations/{token}")
    assert status == 410, body

    clock.advance(40 * DAY)
    tick_and_sweep(runtime)
    assert Invitation.select().count() == SandboxSigninLink.select().count() == DeveloperInvite.select().count() == 0
    assert AuditEvent.select().where(AuditEvent.action == "invitation.created").exists()  # the audit stays


@pytest.mark.gen_test(timeout=120)
async def test_a_console_session_goes_a_margin_after_its_lifetime_however_recently_used(http_client, base_url,
                                                                                       runtime, clock, world):
    console = ConsoleClient(http_client, base_url)
    _, url, _ = invite_developer(runtime, world.app.id, "dev@partner.example")
    path = urllib.parse.urlsplit(url).path
    assert (await console.get(path)).code == 200
    assert (await console.post(path, {"password": PASSWORD, "confirm": PASSWORD})).code == 303, console.last_html
    assert (await console.sign_in("dev@partner.example", PASSWORD)).code == 303, console.last_html
    await console.keep_busy(runtime, runtime.settings.console_session_lifetime - 60)  # used a minute before its end
    clock.advance(margin(runtime.settings).total_seconds())  # over for less than the margin: kept
    assert sweep_retention(runtime)["console_sessions"] == 0 and ConsoleSession.select().count() == 1
    clock.advance(120)  # over for more than the margin (its last use was well within SVC_CONSOLE_IDLE_TIMEOUT)
    assert sweep_retention(runtime)["console_sessions"] == 1 and ConsoleSession.select().count() == 0


def test_the_sweep_runs_once_a_day_whoever_ticks(runtime, clock):
    from workers.retention import retention_due
    assert retention_due(runtime) is not None
    assert retention_due(runtime) is None  # another scheduler, the same day
    clock.advance(DAY)
    assert retention_due(runtime) is not None


def test_a_day_s_claims_go_once_the_day_is_past_the_links_margin(runtime, clock):
    """The schedulers' one row per job and day (the night, the sweep, a failed sync) grew without
    end: a day's rows go once that day is more than `LINKS_KEPT` ago; recent days' stay, so no night
    is claimed twice."""
    from models.schedule import ScheduledRun
    from workers.retention import LINKS_KEPT, retention_due
    first_day = clock.now().date()
    assert ScheduledRun.claim("nightly-sync", first_day) and retention_due(runtime) is not None
    clock.advance(LINKS_KEPT.days * DAY)
    assert retention_due(runtime)["scheduled_runs"] == 0  # that day is exactly LINKS_KEPT ago: kept
    assert ScheduledRun.claim("nightly-sync", clock.now().date())
    clock.advance(DAY)
    assert retention_due(runtime)["scheduled_runs"] == 2  # the first day's night and sweep
    assert not ScheduledRun.claim("nightly-sync", first_day + dt.timedelta(days=LINKS_KEPT.days))  # kept: no second night
    assert sorted(r.run_date for r in ScheduledRun.select()) == [
        first_day + dt.timedelta(days=LINKS_KEPT.days + n) for n in (0, 0, 1)]
