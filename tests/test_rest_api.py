"""The partner REST API over HTTP: authentication, listings, invitations, appointments, activation."""
from __future__ import annotations

import asyncio
import json
import re
import urllib.parse

import pytest
from jose import jwt

from lifecycle.applications import install_application, register_application
from lifecycle.organizations import create_organization
from lifecycle.users import create_user
from lifecycle.activation import set_activation_status
from lifecycle.billing import MONTH
from lifecycle.verification import record_platform_verification
from models.application import Installation
from models.audit import AuditEvent
from models.directory import Organization, User
from models.ids import ID_PATTERN, is_id
from models.npi import NPI_PATTERN, is_npi
from partner_api.appointments import DEFAULT_LIMIT, MAX_LIMIT
from partner_api.testdata import TEST_APPOINTMENT_COUNT
from helpers.rest import complete_snapshot, partner_headers


@pytest.fixture
def other_app(runtime):
    app, secret = register_application(runtime, "Other App", "https://other.example/main",
                                       "https://other.example/launch")
    return app, secret


# -- authentication ---------------------------------------------------------------------------

@pytest.mark.gen_test
async def test_client_credentials_token_opens_the_api_and_bad_tokens_get_401(api, world, flow, clock):
    app = world.app
    path = f"/v1/applications/{app.id}/organizations"
    headers = await partner_headers(api, app, world.secret)
    status, _, body = await api.call("GET", path, headers=headers)
    assert status == 200 and [o["id"] for o in body] == [world.org.id]

    user_tokens = await flow.tokens()  # a user access token has another audience
    for bad in (None, "Bearer nonsense", f"Bearer {user_tokens['access_token']}",
                f"Bearer {world.sandbox_token}", "Basic Zm9vOmJhcg=="):
        status, resp_headers, body = await api.call("GET", path, headers={"Authorization": bad} if bad else {})
        assert status == 401, bad
        assert body["error"] == "invalid_token" and resp_headers["WWW-Authenticate"].startswith("Bearer")

    # expired
    clock.advance(api.runtime.settings.client_token_ttl + 1)  # 300 s
    status, _, _ = await api.call("GET", path, headers=headers)
    assert status == 401
    clock.offset = 0
    # revoked: its jti on the deny-list
    token = headers["Authorization"].split(" ", 1)[1]
    api.runtime.denylist.deny([jwt.get_unverified_claims(token)["jti"]], until=clock.time() + 300)
    status, _, _ = await api.call("GET", path, headers=headers)
    assert status == 401


@pytest.mark.gen_test
async def test_token_accepts_form_and_basic(api, world):
    from helpers.http import basic_auth
    app = world.app
    status, _, body = await api.call("POST", "/v1/oauth/token", body="grant_type=client_credentials",
                                     headers={"Authorization": basic_auth(app.client_id, world.secret),
                                              "Content-Type": "application/x-www-form-urlencoded"})
    assert status == 200 and body["token_type"] == "Bearer" and body["expires_in"] == api.runtime.settings.client_token_ttl
    status, _, body = await api.call("POST", "/v1/oauth/token", {
        "grant_type": "client_credentials", "client_id": app.client_id, "client_secret": "wrong"})
    assert status == 401 and body["error"] == "invalid_client"
    status, _, body = await api.call("POST", "/os-api/v2/oauth/token", {
        "grant_type": "client_credentials", "client_id": app.client_id, "client_secret": world.secret})
    assert status == 400 and body["error"] == "unsupported_grant_type"


# -- organizations and users --------------------------------------------------------------------

@pytest.mark.gen_test
async def test_organizations_only_own_app_and_installations(api, world, other_app, runtime):
    app = world.app
    elsewhere = create_organization("Elsewhere")
    install_application(other_app[0].id, elsewhere.id)
    headers = await partner_headers(api, app, world.secret)
    status, _, body = await api.call("GET", f"/v1/applications/{app.id}/organizations", headers=headers)
    assert status == 200
    assert body == [{"id": world.org.id, "name": "Test Clinic", "ehr": "sandbox",
                     "installed_at": body[0]["installed_at"], "activation_status": None, "user_count": 2}]
    status, _, body = await api.call("GET", f"/v1/applications/{other_app[0].id}/organizations", headers=headers)
    assert status == 403 and body["error"] == "forbidden"
    status, _, body = await api.call("GET", "/v1/applications/app_nope/organizations", headers=headers)
    assert status == 404 and body["error"] == "application_not_found"
    status, _, body = await api.call("GET", "/v1/applications/bad%20id!/organizations", headers=headers)
    assert status == 400 and body["error"] == "invalid_path_parameter"
    # users of an organization the app is not installed in / unknown
    base = f"/v1/applications/{app.id}/organizations"
    status, _, body = await api.call("GET", f"{base}/{elsewhere.id}/users", headers=headers)
    assert status == 403 and body["error"] == "not_installed"
    status, _, body = await api.call("GET", f"{base}/org_missing/users", headers=headers)
    assert status == 404 and body["error"] == "organization_not_found"


@pytest.mark.gen_test
async def test_user_status_follows_what_happened(api, world, flow, runtime):
    app = world.app
    headers = await partner_headers(api, app, world.secret)
    invited = (await api.call("POST", "/v1/invitations", {
        "email": "new@clinic.example", "given_name": "New", "family_name": "Person",
        "organization_name": "Invited Clinic"}, headers=headers))[2]
    path = f"/v1/applications/{app.id}/organizations/{world.org.id}/users"

    status, _, users = await api.call("GET", path, headers=headers)
    assert status == 200
    by_email = {u["email"]: u for u in users}
    assert by_email["doc@example.com"]["status"] == "active"
    assert by_email["doc@example.com"]["authorized_at"] is None and by_email["doc@example.com"]["last_launch_at"] is None

    await flow.launch()  # a launch alone does not authorize
    record_platform_verification(runtime, app, world.physician)  # the platform verified the app's token
    status, _, users = await api.call("GET", path, headers=headers)
    doc = {u["email"]: u for u in users}["doc@example.com"]
    assert doc["status"] == "authorized" and doc["authorized_at"] and doc["last_launch_at"]
    assert doc["npi"] == "1234567893" and doc["given_name"] == "Doc"
    assert {u["email"]: u for u in users}["staff@example.com"]["status"] == "active"

    invited_path = f"/v1/applications/{app.id}/organizations/{invited['organization_id']}/users"
    status, _, users = await api.call("GET", invited_path, headers=headers)
    assert [(u["email"], u["status"]) for u in users] == [("new@clinic.example", "invited")]
    token = urllib.parse.urlsplit(invited["invitation_url"]).path.rsplit("/", 1)[1]
    status, _, _ = await api.call("GET", f"/invitations/{token}")
    assert status == 302
    status, _, users = await api.call("GET", invited_path, headers=headers)
    assert users[0]["status"] == "active"


# -- invitations ----------------------------------------------------------------------------------

INVITE = {"email": "Ann.Example@Clinic.example", "given_name": "Ann", "family_name": "Example",
          "organization_name": "Ann's Clinic", "npi": "1245319599"}


@pytest.mark.gen_test
async def test_invitation_creates_everything_once_and_link_works_once(api, world, runtime):
    app = world.app
    headers = await partner_headers(api, app, world.secret)
    status, _, body = await api.call("POST", "/v1/invitations", INVITE, headers=headers)
    assert status == 201, body
    user = User.get_by_id(body["user_id"])
    assert user.email == "ann.example@clinic.example" and user.npi == "1245319599"
    assert user.organization_id == body["organization_id"]
    assert Organization.get_by_id(body["organization_id"]).name == "Ann's Clinic"
    assert Installation.find(app.id, body["organization_id"]) is not None
    assert body["invitation_url"].startswith(runtime.settings.public_url + "/invitations/")
    orgs_before = Organization.select().count()

    status, _, again = await api.call("POST", "/v1/invitations", {**INVITE, "organization_name": "Other"},
                                      headers=headers)
    assert status == 409 and again["error"] == "email_taken"
    assert Organization.select().count() == orgs_before and User.select().where(
        User.email == "ann.example@clinic.example").count() == 1

    link = urllib.parse.urlsplit(body["invitation_url"]).path
    status, resp_headers, _ = await api.call("GET", link)
    assert status == 302
    assert resp_headers["Location"] == f"{runtime.settings.public_url}/sandbox/hub"
    cookie = resp_headers["Set-Cookie"]  # the invitation signs the user in to their hub
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie
    status, _, page = await api.call("GET", "/sandbox/hub", headers={"Cookie": cookie.split(";")[0]})
    assert status == 200 and "Ann" in page
    assert User.get_by_id(user.id).activated_at is not None
    status, _, used = await api.call("GET", link)
    assert status == 410 and used["error"] == "invitation_used"
    status, _, unknown = await api.call("GET", "/invitations/not-a-real-token")
    assert status == 404 and unknown["error"] == "invitation_not_found"


@pytest.mark.gen_test
async def test_invitation_link_expires(api, world, runtime, clock):
    headers = await partner_headers(api, world.app, world.secret)
    status, _, body = await api.call("POST", "/v1/invitations", INVITE, headers=headers)
    assert status == 201
    clock.advance(runtime.settings.invitation_ttl + 1)
    status, _, expired = await api.call("GET", urllib.parse.urlsplit(body["invitation_url"]).path)
    assert status == 410 and expired["error"] == "invitation_expired"
    assert User.get_by_id(body["user_id"]).activated_at is None


@pytest.mark.gen_test
async def test_an_invitation_that_expired_unopened_can_be_sent_again(api, world, runtime, clock, other_app):
    """The expired link says "ask for a new invitation", but inviting the e-mail again answered 409
    `email_taken` for ever: the clinician could never get in, and no app could ever invite that
    e-mail. Its inviting app may now invite it again: a new link for the same user and organization,
    with this request's details; the expired link stays dead. While a link is live, once it was used,
    or for another app, the e-mail is still taken."""
    headers = await partner_headers(api, world.app, world.secret)
    status, _, first = await api.call("POST", "/v1/invitations", INVITE, headers=headers)
    assert status == 201
    status, _, body = await api.call("POST", "/v1/invitations", INVITE, headers=headers)
    assert status == 409 and body["error"] == "email_taken"  # its link is live

    clock.advance(runtime.settings.invitation_ttl + 1)
    orgs, users = Organization.select().count(), User.select().count()
    headers, other_headers = await partner_headers(api, world.app, world.secret), await partner_headers(api, *other_app)
    status, _, body = await api.call("POST", "/v1/invitations", INVITE, headers=other_headers)
    assert status == 409 and body["error"] == "email_taken"  # another app's invitee is not its to invite
    racing = await asyncio.gather(*[api.call("POST", "/v1/invitations", {  # sent twice at once: one new link
        **INVITE, "given_name": "Anna", "organization_name": "Anna's Clinic", "npi": "1234567893"}, headers=headers)
        for _ in range(3)])
    assert sorted(status for status, _, _ in racing) == [201, 409, 409], racing
    again = next(body for status, _, body in racing if status == 201)
    assert (again["organization_id"], again["user_id"]) == (first["organization_id"], first["user_id"])
    assert again["invitation_url"] != first["invitation_url"]
    assert (Organization.select().count(), User.select().count()) == (orgs, users)  # nothing new was created
    user = User.get_by_id(first["user_id"])
    assert (user.given_name, user.npi) == ("Anna", "1234567893")
    assert Organization.get_by_id(first["organization_id"]).name == "Anna's Clinic"

    status, _, old = await api.call("GET", urllib.parse.urlsplit(first["invitation_url"]).path)
    assert status == 410 and old["error"] == "invitation_expired"
    status, _, _ = await api.call("GET", urllib.parse.urlsplit(again["invitation_url"]).path)
    assert status == 302 and User.get_by_id(user.id).activated_at is not None
    clock.advance(runtime.settings.invitation_ttl + 1)
    headers = await partner_headers(api, world.app, world.secret)
    status, _, body = await api.call("POST", "/v1/invitations", INVITE, headers=headers)
    assert status == 409 and body["error"] == "email_taken"  # accepted: an account in use


@pytest.mark.gen_test
async def test_an_invitee_whose_expired_links_were_swept_can_still_be_invited_again(api, world, runtime, clock,
                                                                                    other_app):
    """The retention sweep deletes invitation links 30 days after they expired: the invitee, never
    activated, is still the inviting app's to invite again (the app installed in the clinic their
    invitation made), and still no other app's."""
    import datetime as dt
    from models.invitations import Invitation
    from workers.retention import LINKS_KEPT, sweep_retention
    headers = await partner_headers(api, world.app, world.secret)
    status, _, first = await api.call("POST", "/v1/invitations", INVITE, headers=headers)
    assert status == 201
    clock.advance(runtime.settings.invitation_ttl + LINKS_KEPT.total_seconds() + dt.timedelta(days=1).total_seconds())
    sweep_retention(runtime)
    assert not Invitation.select().where(Invitation.user == first["user_id"]).exists()
    status, _, body = await api.call("POST", "/v1/invitations", INVITE, headers=await partner_headers(api, *other_app))
    assert status == 409 and body["error"] == "email_taken"
    from lifecycle.applications import install_application
    from models.application import Installation
    installed = install_application(other_app[0].id, first["organization_id"])  # two apps: whose invitee?
    for app, secret in (other_app, (world.app, world.secret)):
        status, _, body = await api.call("POST", "/v1/invitations", INVITE, headers=await partner_headers(api, app, secret))
        assert status == 409 and body["error"] == "email_taken"
    Installation.delete().where(Installation.id == installed.id).execute()
    status, _, again = await api.call("POST", "/v1/invitations", INVITE,
                                      headers=await partner_headers(api, world.app, world.secret))
    assert status == 201, again
    assert (again["organization_id"], again["user_id"]) == (first["organization_id"], first["user_id"])
    status, _, _ = await api.call("GET", urllib.parse.urlsplit(again["invitation_url"]).path)
    assert status == 302


@pytest.mark.gen_test
async def test_invitation_bad_input_is_a_clear_400(api, world):
    headers = await partner_headers(api, world.app, world.secret)
    json_headers = {**headers, "Content-Type": "application/json"}
    cases = [
        (b"{not json", "invalid_request"),
        (b"[1, 2]", "invalid_request"),
        (json.dumps({**INVITE, "email": 5}).encode(), "invalid_request"),
        (json.dumps({**INVITE, "email": "not-an-email"}).encode(), "invalid_request"),
        (json.dumps({**INVITE, "npi": "12"}).encode(), "invalid_request"),
        (json.dumps({**INVITE, "npi": "\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669\u0660"}).encode(),
         "invalid_request"),  # Arabic-Indic digits are no NPI
        (json.dumps({k: v for k, v in INVITE.items() if k != "given_name"}).encode(), "invalid_request"),
        (json.dumps({**INVITE, "role": "admin"}).encode(), "unknown_field"),
        (b"\xff\xfe", "invalid_request"),
    ]
    for raw, error in cases:
        status, _, body = await api.call("POST", "/v1/invitations", body=raw, headers=json_headers)
        assert (status, body["error"]) == (400, error), raw
        assert body["message"]
    status, _, body = await api.call("POST", "/v1/invitations", body=b"email=a", headers={
        **headers, "Content-Type": "application/x-www-form-urlencoded"})
    assert status == 415 and body["error"] in ("unsupported_media_type", "invalid_request") and body["message"]
    status, _, body = await api.call("POST", "/v1/invitations", body=b"{" + b" " * 70000 + b"}",
                                     headers=json_headers)
    assert status == 413 and body["error"] == "request_too_large"
    assert User.select().count() == 2  # nothing was created by any of them


@pytest.mark.gen_test
async def test_an_e_mail_spelled_another_way_is_the_same_user_or_a_400(api, world):
    """An e-mail names one user, but only its exact lower-cased text was compared: inviting the
    clinic's doc@example.com as `ＤＯＣ@example.com` (fullwidth), `doc@ｅｘａｍｐｌｅ．ｃｏｍ`, with an
    ideographic full stop, or a decomposed `ü`, got 201 and a second account for the same mailbox;
    a trailing dot, an empty label or a zero-width character made one too. Now the address is
    normalised (NFKC) before it is compared and stored: 409 `email_taken`, or 400."""
    headers = await partner_headers(api, world.app, world.secret)
    for spelling in ("\uff24\uff2f\uff23@example.com", "doc@\uff45\uff58\uff41\uff4d\uff50\uff4c\uff45\uff0e\uff43\uff4f\uff4d",
                     "doc@example\u3002com"):
        status, _, body = await api.call("POST", "/v1/invitations", {**INVITE, "email": spelling}, headers=headers)
        assert (status, body["error"]) == (409, "email_taken"), spelling
    status, _, body = await api.call("POST", "/v1/invitations", {**INVITE, "email": "Mu\u0308ller@clinic.example"},
                                     headers=headers)
    assert status == 201 and User.get_by_id(body["user_id"]).email == "m\u00fcller@clinic.example"
    status, _, body = await api.call("POST", "/v1/invitations", {**INVITE, "email": "m\u00fcller@clinic.example"},
                                     headers=headers)
    assert (status, body["error"]) == (409, "email_taken")
    for bad in ("doc@example.com.", "doc@.example.com", "doc@example..com", "doc\u200b@example.com",
                "doc@example.com\u200e"):
        status, _, body = await api.call("POST", "/v1/invitations", {**INVITE, "email": bad}, headers=headers)
        assert (status, body["error"]) == (400, "invalid_request") and "e-mail" in body["message"], bad
    assert User.select().count() == 3  # the clinic's two, and Müller once


def test_a_body_missing_several_fields_is_told_the_same_in_every_process():
    """The fields were checked in a frozenset's order, which is the process's string-hash order
    (`PYTHONHASHSEED`): a body missing several fields was told about a different one by each
    `serve` process; a chart request's too. They are checked in the documented order: `email`,
    `svc_organization_id` first."""
    import os
    import subprocess
    import sys
    from helpers.environment import ROOT
    code = ("from partner_api.invitations import invitation_fields\n"
            "from partner_api.charts import create_request\n"
            "for call in (lambda: invitation_fields({}), lambda: create_request(None, None, {})):\n"
            "    try:\n        call()\n    except Exception as exc:\n        print(exc.body()['message'])\n")
    told = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": str(seed)},
                           cwd=str(ROOT), capture_output=True, text=True, check=True).stdout for seed in range(6)}
    assert told == {"email is required and must be a non-empty string.\n"
                    "svc_organization_id is required and must be a string.\n"}


@pytest.mark.gen_test
async def test_a_bad_optional_npi_is_not_called_required(api, world):
    """`npi` is optional: a partner sending `"npi": ""` or a number was told "npi is required",
    which sent them looking for a rule that does not exist. The 400 says what is wrong with it."""
    headers = await partner_headers(api, world.app, world.secret)
    for npi in ("", "   ", 1234567893):
        status, _, body = await api.call("POST", "/v1/invitations", {**INVITE, "npi": npi}, headers=headers)
        assert (status, body["error"]) == (400, "invalid_request"), npi
        assert "required" not in body["message"] and "npi" in body["message"] and "optional" in body["message"], body
    status, _, body = await api.call("POST", "/v1/invitations", {**INVITE, "given_name": 7}, headers=headers)
    assert status == 400 and "given_name is required" in body["message"]  # a required field still says so
    assert User.select().count() == 2


# -- appointments -----------------------------------------------------------------------------------

@pytest.fixture
def snapshot_clinic(world, runtime):
    """Two physicians, one of whom completed the app's auth flow, and a snapshot of both."""
    second = create_user(world.org.id, "doc2@example.com", "Second", "Doc", npi="1245319599")
    installation = record_platform_verification(runtime, world.app, world.physician)  # Disabled
    set_activation_status(runtime, installation, "Enabled", "test")  # a Disabled app reads no clinic data
    snap = complete_snapshot(runtime.clock, world.org, [world.physician, second], per_provider=60)
    return {"second": second, "snapshot": snap}


@pytest.mark.gen_test
async def test_appointments_pages_are_stable_and_only_authorized_providers(api, world, snapshot_clinic, runtime):
    headers = await partner_headers(api, world.app, world.secret)
    path = f"/v1/appointments/{world.org.id}"
    status, _, first = await api.call("GET", path, headers=headers)
    assert status == 200
    assert (first["offset"], first["limit"], first["total"]) == (0, DEFAULT_LIMIT, 60)
    assert first["snapshot_date"] == snapshot_clinic["snapshot"].snapshot_date.isoformat()
    status, _, second = await api.call("GET", path + f"?offset={DEFAULT_LIMIT}&limit={MAX_LIMIT}", headers=headers)
    assert (second["offset"], len(second["appointments"])) == (DEFAULT_LIMIT, 60 - DEFAULT_LIMIT)
    seen = [a["id"] for a in first["appointments"] + second["appointments"]]
    assert len(seen) == len(set(seen)) == 60
    assert all(a["provider"]["user_id"] == world.physician.id for a in first["appointments"])
    keys = [(a["start"], a["id"]) for a in first["appointments"] + second["appointments"]]
    assert [k[0] for k in keys] == sorted(k[0] for k in keys)
    # small pages walk the same order
    walked = []
    for offset in range(0, 60, 7):
        walked += [a["id"] for a in (await api.call("GET", f"{path}?offset={offset}&limit=7", headers=headers))[2][
            "appointments"]]
    assert walked == seen
    a = first["appointments"][0]
    assert list(a) == ["id", "start", "end", "status", "appointment_type", "reason", "location", "provider",
                       "patient"]
    assert list(a["patient"]) == ["id", "first_name", "last_name", "date_of_birth", "sex"]

    record_platform_verification(runtime, world.app, snapshot_clinic["second"])
    status, _, both = await api.call("GET", path, headers=headers)
    assert both["total"] == 120


@pytest.mark.gen_test
async def test_appointments_bad_paging_and_access(api, world, snapshot_clinic, other_app):
    headers = await partner_headers(api, world.app, world.secret)
    path = f"/v1/appointments/{world.org.id}"
    for query in (f"limit={MAX_LIMIT + 1}", "limit=-1", "limit=abc", "offset=-1", "offset=1.5", "limit=0", "limit=", "limit=1e2",
                  "limit=1&limit=2", "limit=%D9%A1%D9%A0", "limit=1%0A"):  # 10 in Arabic-Indic digits; a newline
        status, _, body = await api.call("GET", f"{path}?{query}", headers=headers)
        assert status == 400 and body["error"] in ("invalid_pagination", "invalid_request"), query
    other_headers = await partner_headers(api, *other_app)
    status, _, body = await api.call("GET", path, headers=other_headers)
    assert status == 403 and body["error"] == "not_installed"
    status, _, body = await api.call("GET", "/v1/appointments/org_unknown", headers=headers)
    assert status == 404
    # installed but no snapshot yet: an empty page
    org = create_organization("No Snapshot Yet")
    install_application(world.app.id, org.id)
    status, _, body = await api.call("GET", f"/v1/appointments/{org.id}", headers=headers)
    assert status == 200 and body == {"appointments": [], "offset": 0, "limit": DEFAULT_LIMIT, "total": 0,
                                      "snapshot_date": None}


@pytest.mark.gen_test
async def test_appointments_read_only_the_latest_complete_snapshot(api, world, snapshot_clinic, runtime):
    import datetime as dt
    from models.appointments import Snapshot
    headers = await partner_headers(api, world.app, world.secret)
    tomorrow = snapshot_clinic["snapshot"].snapshot_date + dt.timedelta(days=1)
    Snapshot.create(organization=world.org.id, snapshot_date=tomorrow, status="building")
    status, _, body = await api.call("GET", f"/v1/appointments/{world.org.id}", headers=headers)
    assert body["snapshot_date"] == snapshot_clinic["snapshot"].snapshot_date.isoformat() and body["total"] == 60
    complete_snapshot(runtime.clock, world.org, [world.physician], per_provider=4, day=tomorrow)
    status, _, body = await api.call("GET", f"/v1/appointments/{world.org.id}", headers=headers)
    assert body["snapshot_date"] == tomorrow.isoformat() and body["total"] == 4


OFFSETS = range(0, TEST_APPOINTMENT_COUNT, DEFAULT_LIMIT)  # every page of the test organization's set


@pytest.mark.gen_test
async def test_test_organization_returns_the_fixed_data_set(api, world, other_app):
    pages = []
    for app, secret in ((world.app, world.secret), other_app):
        headers = await partner_headers(api, app, secret)
        got = []
        for offset in OFFSETS:
            status, _, body = await api.call("GET", f"/v1/appointments/123456789?offset={offset}", headers=headers)
            assert status == 200 and body["total"] == TEST_APPOINTMENT_COUNT
            got.append(body)
        pages.append(got)
    assert pages[0] == pages[1]  # the same for any caller
    ids = [a["id"] for page in pages[0] for a in page["appointments"]]
    assert len(ids) == len(set(ids)) == TEST_APPOINTMENT_COUNT
    assert [len(p["appointments"]) for p in pages[0]] == [min(DEFAULT_LIMIT, TEST_APPOINTMENT_COUNT - o) for o in OFFSETS]
    status, _, _ = await api.call("GET", "/v1/appointments/123456789")
    assert status == 401


# -- activation status ---------------------------------------------------------------------------------

@pytest.mark.gen_test
async def test_activation_status_lifecycle(api, world, runtime, clock):
    app, org = world.app, world.org
    headers = await partner_headers(api, app, world.secret)
    path = f"/v1/applications/{app.id}/organizations/{org.id}/activation-status"
    status, _, body = await api.call("PUT", path, {"status": "Enabled"}, headers=headers)
    assert status == 409 and body["error"] == "not_initialized"

    record_platform_verification(runtime, app, world.physician)  # first SDK initialization: Disabled
    assert Installation.find(app.id, org.id).activation_status == "Disabled"
    for bad in ({"status": "enabled"}, {"status": 1}, {}, {"status": "Enabled", "extra": 1}):
        status, _, body = await api.call("PUT", path, bad, headers=headers)
        assert status == 400, bad
    status, _, body = await api.call("PUT", path, {"status": "Enabled"}, headers=headers)
    assert status == 200 and body["status"] == "Enabled" and body["trial_started_at"]
    started = body["trial_started_at"]
    clock.advance(120)
    await api.call("PUT", path, {"status": "Disabled"}, headers=headers)
    status, _, body = await api.call("PUT", path, {"status": "Enabled"}, headers=headers)
    assert body == {"status": "Enabled", "trial_started_at": started}  # only the first Enabled starts the trial
    events = [e.detail["after"] for e in AuditEvent.select().where(
        AuditEvent.action == "installation.activation_status_set").order_by(AuditEvent.id)]
    assert events == ["Disabled", "Enabled", "Disabled", "Enabled"]  # the first: the platform's, at initialization
    status, _, body = await api.call("GET", f"/v1/applications/{app.id}/organizations", headers=headers)
    assert body[0]["activation_status"] == "Enabled"


@pytest.mark.gen_test
async def test_openapi_document_is_served_and_valid(api, runtime):
    from openapi_spec_validator import validate
    status, headers, doc = await api.call("GET", "/v1/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.1")
    validate(doc)
    for path in ("/v1/invitations", "/v1/appointments/{svcOrganizationId}", "/v1/oauth/token",
                 "/v1/chart-retrieval/download-url/{requestId}",
                 "/v1/applications/{applicationId}/organizations/{organizationId}/activation-status"):
        assert path in doc["paths"]


def patterns_of(node, key: str = "") -> list[tuple[str, str]]:
    """(the key that holds it, pattern) for every JSON Schema `pattern` in an OpenAPI document."""
    if isinstance(node, list):
        return [found for item in node for found in patterns_of(item, key)]
    if not isinstance(node, dict):
        return []
    name = node.get("name", key) if "in" in node else key  # a parameter: its name
    found = [(name, node["pattern"])] if isinstance(node.get("pattern"), str) else []
    return found + [hit for k, v in node.items() for hit in patterns_of(v, name if k == "schema" else k)]


@pytest.mark.gen_test
async def test_the_served_openapi_patterns_are_the_products_grammars(api):
    """Every id the document constrains has `models.ids`'s grammar (a hand copy once admitted `.`
    and `..`, which the service refuses), every NPI `models.npi`'s."""
    status, _, doc = await api.call("GET", "/v1/openapi.json")
    assert status == 200
    found = patterns_of(doc)
    ids = {pattern for key, pattern in found if key.endswith(("_id", "Id"))}
    npis = {pattern for key, pattern in found if key == "npi"}
    assert ids == {ID_PATTERN} and npis == {NPI_PATTERN}
    assert {pattern for _, pattern in found} - ids - npis <= {"^[a-z][a-z0-9_]*$", MONTH.pattern}  # no other grammar
    for bad_id in (".", "..", "a/b", "x" * 65, ""):
        assert re.search(ID_PATTERN, bad_id) is None and not is_id(bad_id), bad_id
    for good_id in ("a.b", "..a", "pat-b15c092f2447b7a2", "usr_demo", "x" * 64):
        assert re.search(ID_PATTERN, good_id) and is_id(good_id), good_id
    for bad_npi in ("\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669\u0660", "123456789", "12345678931"):
        assert re.search(NPI_PATTERN, bad_npi) is None and not is_npi(bad_npi), bad_npi
    assert re.search(NPI_PATTERN, "1245319599") and is_npi("1245319599")
