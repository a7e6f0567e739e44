"""The platform FHIR R4 API for apps (`/fhir/r4/{org}`) end to end, over real HTTP against a
`svc-auth serve` process on both databases: what needs HTTP. Metadata and formats, answers and
refusals as FHIR JSON (OperationOutcomes with their headers, path decoding, methods), the 401
challenge, CORS, and the token of a real launch. The API's rules (scopes, compartments, clinics,
installations, search parsing, paging) are tested in-process in tests/test_fhir_api_rules.py."""
from __future__ import annotations

import json
import threading
import time
import urllib.parse

from connectors.sandbox import PANEL_SIZE
from helpers.fhir_api import ALL_TYPES, Fhir, outcome, resources
from helpers.http import http
from helpers.tokens import as_service, mint_platform_token
from helpers.worlds import clinic
from fhir_api.api import RETRY_AFTER_SECONDS

from lifecycle.applications import install_application
from lifecycle.users import create_user
from models.application import Application, Installation
from models.audit import AuditEvent
from models.directory import User
from models.disclosures import DisclosureRecord


def test_metadata_is_a_public_capability_statement(live, world):
    fhir = Fhir(live, world.org.id, None)
    status, headers, body = fhir.get("/metadata", headers={"Origin": "https://anywhere.example"})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == "*"
    assert headers["Content-Type"].startswith("application/fhir+json")
    assert body["resourceType"] == "CapabilityStatement" and body["fhirVersion"] == "4.0.1"
    assert body["format"] == ["json"] and body["kind"] == "instance"
    rest = body["rest"][0]
    assert rest["mode"] == "server"
    assert rest["security"]["service"][0]["coding"][0]["code"] == "SMART-on-FHIR"
    uris = {e["url"]: e["valueUri"] for e in rest["security"]["extension"][0]["extension"]}
    assert uris == {"authorize": f"{live}/v1/oauth/authorize", "token": f"{live}/v1/oauth/token",
                    "introspect": f"{live}/v1/oauth/introspect", "revoke": f"{live}/v1/oauth/revoke"}
    served = {r["type"]: r for r in rest["resource"]}
    assert set(served) == set(ALL_TYPES) | {"Group"}  # Group: Bulk Data's (tests/test_bulk_export.py)
    for resource in (served[kind] for kind in ALL_TYPES):
        assert {i["code"] for i in resource["interaction"]} == {"read", "search-type"}
        assert "_id" in {p["name"] for p in resource["searchParam"]}
    assert {p["name"] for p in served["Appointment"]["searchParam"]} >= {"patient", "practitioner", "actor", "date"}
    # JSON only.
    assert fhir.get("/metadata", {"_format": "json"})[0] == 200
    status, _, body = fhir.get("/metadata", {"_format": "xml"})
    assert status == 406 and outcome(body) == "not-supported"
    status, _, body = fhir.get("/metadata", headers={"Accept": "application/fhir+xml"})
    assert status == 406 and outcome(body) == "not-supported"
    assert fhir.get("/metadata", headers={"Accept": "application/fhir+xml, application/json;q=0.5"})[0] == 200


def test_answers_and_refusals_over_http_are_fhir_json(live, runtime, world):
    """Reads, searches and each kind of refusal as the handlers render them: FHIR JSON bodies
    (OperationOutcomes for errors, with their headers), URLs of the live service, decoded paths."""
    fhir = Fhir(live, world.org.id, mint_platform_token(runtime, live, world.physician, world.app, world.org.id))
    bundle = fhir.search("Patient", {"_count": 2})
    mine, other = resources(bundle)
    assert bundle["total"] == PANEL_SIZE and bundle["entry"][0]["fullUrl"] == f"{fhir.base}/Patient/{mine['id']}"
    assert [link["url"] for link in bundle["link"] if link["relation"] == "next"][0].startswith(fhir.base + "/Patient?")
    assert fhir.ok(f"/Patient/{mine['id']}") == mine
    assert fhir.ok(f"/Practitioner/{world.physician.id}")["identifier"][0]["value"] == world.physician.npi
    # 404 and 403 from the scopes and the compartment (tests/test_fhir_api_rules.py has every rule).
    narrow = Fhir(live, world.org.id, mint_platform_token(runtime, live, world.physician, world.app, world.org.id,
                                                          scope="openid patient/Patient.rs", patient=mine["id"]))
    status, _, body = narrow.get(f"/Patient/{other['id']}")
    assert status == 404 and outcome(body) == "not-found"
    status, _, body = narrow.get("/Appointment")
    assert status == 403 and outcome(body) == "forbidden"
    # Bad input: 4xx OperationOutcomes, paths decoded once and refused whole.
    cases = [
        ("/Patient", {"birthdate": "1970-02-30"}, 400),            # a malformed value of a served parameter
        ("/Appointment", {"date": "2026-01-01T10:00"}, 400),       # a time needs a zone
        ("/Observation", {"date": "0001-01-01T00:00:00+01:00"}, 400),  # valid as written, before year 1 in UTC
        ("/Observation", {"date": "9999-12-31T23:59:59-01:00"}, 400),  # after year 9999 in UTC
        ("/Appointment", {"date": "gt9999-12-31T23:59:59Z"}, 400),     # its upper bound past year 9999
        ("/Observation", {"_lastUpdated": "le0001-01-01T00:00:00+01:00"}, 400),
        ("/Patient", {"_format": "xml"}, 406),
        ("/Patient/a%00b", None, 400),
        ("/Patient/" + "x" * 5000, None, 400),
        ("/Patient/pat%252Fx", None, 400),                         # double-encoded
        ("/Patient/%2e%2e", None, 400),
        ("/Patient/%ff%fe", None, 400),                            # not UTF-8
        ("/Patient/%7B%22a%22%3A%5B%5B%5B%5B1%5D%5D%5D%5D%7D", None, 400),  # nested JSON as an id
        ("/Basic/x", None, 404),                                   # a type not served
        ("/Basic", None, 404),
    ]
    for path, params, expected in cases:
        status, headers, body = fhir.get(path, params)
        assert status == expected, (path, params, status, body)
        assert outcome(body) and headers["Content-Type"].startswith("application/fhir+json"), (path, params)
    status, _, body = fhir.get("/Patient?_id=%ff")
    assert status == 400 and outcome(body) == "invalid"
    # `Prefer: handling=strict` in any of RFC 7240's spellings (a quoted value, spaces, case): a 400 naming
    # the parameter not served; `handling=lenient` (or none) ignores it.
    for prefer in ("handling=strict", 'handling="strict"', "respond-async; HANDLING = strict", 'handling = "Strict"'):
        status, _, body = fhir.get("/Patient", {"foo": "bar"}, headers={"Prefer": prefer})
        assert status == 400 and "'foo'" in body["issue"][0]["diagnostics"], (prefer, body)
    for prefer in ("handling=lenient", 'handling="lenient"', "handling=strictly"):
        assert fhir.get("/Patient", {"foo": "bar", "_count": 1}, headers={"Prefer": prefer})[0] == 200, prefer
    # Not a method this API has.
    status, _, body = http("POST", f"{fhir.base}/Patient", b"{}", {"Authorization": f"Bearer {fhir.token}",
                                                                  "Content-Type": "application/fhir+json"})
    assert status == 405 and outcome(json.loads(body)) == "not-supported"
    # A Disabled installation: 403 naming it.
    Installation.update(activation_status="Disabled").where(Installation.application == world.app.id).execute()
    status, _, body = fhir.get("/Patient", {"_count": 1})
    assert status == 403 and outcome(body) == "forbidden" and "Disabled" in body["issue"][0]["diagnostics"]
    # An EHR that is down: 503 transient with Retry-After; metadata still answers (no EHR call).
    down, doc = clinic("Down Clinic", "https://ehr.example/down?outage=1",
                       ("down@example.com", "Do", "Wn", "dwn", "1003000126"))
    install_application(world.app.id, down.id)
    status, _, body = Fhir(live, down.id, narrow.token).get("/Patient")  # another clinic's base: as if none
    assert status == 404 and outcome(body) == "not-found"
    fhir = Fhir(live, down.id, mint_platform_token(runtime, live, doc, world.app, down.id))
    for path in ("/Patient", "/Patient/pat-b15c092f2447b7a2"):
        status, headers, body = fhir.get(path)
        assert status == 503 and headers["Retry-After"] == str(RETRY_AFTER_SECONDS) and outcome(body) == "transient", body
    assert fhir.get("/metadata")[0] == 200


def test_a_path_segment_that_names_no_served_type_gets_the_unsupported_types_answer(live, runtime, world):
    """Whatever stands where the type goes (a type not served, a name of 70 or 10,000 letters, one
    with a digit or in lower case) gets the one FHIR answer: 404 `not-supported`, naming the type
    only when it is a resource type's name (`models.fhir_grammar`), and no audit record."""
    fhir = Fhir(live, world.org.id, mint_platform_token(runtime, live, world.physician, world.app, world.org.id))
    recorded = AuditEvent.select().count()
    for name in ("Basic", "B" + "x" * 69, "B" + "x" * 9_999, "patient", "Patient2", "Pati3nt", "Patient%0A"):
        for path in (f"/{name}", f"/{name}/pat-b15c092f2447b7a2"):
            status, headers, body = fhir.get(path)
            assert status == 404 and headers["Content-Type"].startswith("application/fhir+json"), (path[:20], body)
            assert outcome(body) == "not-supported", (path[:20], body)
            diagnostics = body["issue"][0]["diagnostics"]
            assert ("Basic" in diagnostics) == (name == "Basic") and "xxxxx" not in diagnostics, diagnostics
    assert AuditEvent.select().count() == recorded


def test_a_path_under_a_fhir_base_that_names_nothing_served_gets_an_operation_outcome(live, runtime, world):
    """CONTRACTS ("SMART App Launch and the platform FHIR API"): under `{iss}` errors are
    OperationOutcomes in `application/fhir+json`. A path no route serves (an operation or a history
    this API does not offer, a deeper path, the bare base) answered the service's JSON 404
    (`{"error": "not_found"}`, `application/json`), which a FHIR client cannot read; now a 404
    `not-found` OperationOutcome, with a token or without, whatever the method, nothing recorded."""
    fhir = Fhir(live, world.org.id, mint_platform_token(runtime, live, world.physician, world.app, world.org.id))
    anonymous = Fhir(live, world.org.id, None)
    recorded = DisclosureRecord.select().count()
    paths = ("/Patient/pat-b15c092f2447b7a2/$everything", "/Patient/pat-b15c092f2447b7a2/_history/1",
             "/Patient/pat-b15c092f2447b7a2/x/y", "/Group/clinic/members", "", "/")
    for client in (fhir, anonymous):
        for path in paths:
            status, headers, body = client.get(path)
            assert status == 404 and headers["Content-Type"].startswith("application/fhir+json"), (path, body)
            assert outcome(body) == "not-found", (path, body)
    for method in ("POST", "DELETE"):
        status, headers, raw = http(method, f"{fhir.base}/Patient/pat-b15c092f2447b7a2/$everything", b"{}",
                                    {"Authorization": f"Bearer {fhir.token}", "Content-Type": "application/fhir+json"})
        assert status == 404 and headers["Content-Type"].startswith("application/fhir+json"), (method, raw)
        assert outcome(json.loads(raw)) == "not-found"
    status, headers, raw = http("GET", f"{live}/fhir/r4", None, {})
    assert status == 404 and json.loads(raw)["resourceType"] == "OperationOutcome"
    assert DisclosureRecord.select().count() == recorded


def test_tokens_that_are_missing_bad_expired_or_revoked_get_401(live, runtime, world):
    patient = "pat-b15c092f2447b7a2"
    status, headers, body = Fhir(live, world.org.id, None).get(f"/Patient/{patient}")
    assert status == 401 and outcome(body) == "login"
    assert headers["WWW-Authenticate"].startswith("Bearer realm=") and "error=" not in headers["WWW-Authenticate"]
    expired = mint_platform_token(runtime, live, world.physician, world.app, world.org.id, ttl=60, clock_offset=-3600)
    for token in ("garbage", "a.b.c", expired, "x" * 9000):
        status, headers, body = Fhir(live, world.org.id, token).get("/Patient")
        assert status == 401 and outcome(body) == "login", token[:20]
        assert 'error="invalid_token"' in headers["WWW-Authenticate"]
    # Revoked through the real revocation endpoint by the app itself.
    token = mint_platform_token(runtime, live, world.physician, world.app, world.org.id)
    fhir = Fhir(live, world.org.id, token)
    assert fhir.get("/Patient", {"_count": 1})[0] == 200
    status, _, _ = http("POST", f"{live}/v1/oauth/revoke", urllib.parse.urlencode(
        {"token": token, "client_id": world.app.client_id, "client_secret": world.secret}).encode(),
        {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 200
    status, headers, body = fhir.get("/Patient", {"_count": 1})
    assert status == 401 and 'error="invalid_token"' in headers["WWW-Authenticate"]
    # A user who left the clinic (deleted): their live token reads nothing.
    leaver = create_user(world.org.id, "leaver@example.com", "Lea", "Ver", "lver")
    fhir = Fhir(live, world.org.id, mint_platform_token(runtime, live, leaver, world.app, world.org.id))
    assert fhir.get("/Patient", {"_count": 1})[0] == 200
    User.delete().where(User.id == leaver.id).execute()
    status, headers, _ = fhir.get("/Patient", {"_count": 1})
    assert status == 401 and 'error="invalid_token"' in headers["WWW-Authenticate"]
    # An ID-token-shaped or partner-API token is not a platform access token.
    partner = mint_platform_token(runtime, live, world.physician, world.app, world.org, scope="user/*.rs",
                                  audience="partner_api")
    assert Fhir(live, world.org.id, partner).get("/Patient")[0] == 401


def test_cors_for_the_application_registered_origins(live, runtime, world):
    origin = "https://smart-app.example"
    Application.update(allowed_origins=[origin]).where(Application.id == world.app.id).execute()
    fhir = Fhir(live, world.org.id, mint_platform_token(runtime, live, world.physician, world.app, world.org.id))
    status, headers, _ = http("OPTIONS", f"{fhir.base}/Patient", None, {
        "Origin": origin, "Access-Control-Request-Method": "GET", "Access-Control-Request-Headers": "authorization"})
    assert status == 204 and headers["Access-Control-Allow-Origin"] == origin
    assert "Authorization" in headers["Access-Control-Allow-Headers"]
    # The headers this API reads (docs/fhir-api.md): `Prefer: handling=strict`, a POST `_search`'s
    # Content-Type. A browser sends them only when the preflight allows them (Prefer is no
    # CORS-safelisted header), so a browser app could not ask for strict handling.
    for method, asked in (("GET", "authorization, prefer"), ("POST", "authorization, content-type, prefer")):
        status, headers, _ = http("OPTIONS", f"{fhir.base}/Patient" + ("/_search" if method == "POST" else ""), None, {
            "Origin": origin, "Access-Control-Request-Method": method, "Access-Control-Request-Headers": asked})
        allowed = {h.strip().lower() for h in headers["Access-Control-Allow-Headers"].split(",")}
        assert status == 204 and set(asked.split(", ")) <= allowed and method in headers["Access-Control-Allow-Methods"]
    status, headers, _ = fhir.get("/Patient", {"_count": 1}, headers={"Origin": origin})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == origin
    status, headers, _ = fhir.get("/Patient/nope", headers={"Origin": origin})
    assert status == 404 and headers["Access-Control-Allow-Origin"] == origin  # errors are readable too
    for other in ("https://evil.example", "null"):
        status, headers, _ = fhir.get("/Patient", {"_count": 1}, headers={"Origin": other})
        assert status == 200 and "Access-Control-Allow-Origin" not in headers
        status, headers, _ = http("OPTIONS", f"{fhir.base}/Patient", None, {
            "Origin": other, "Access-Control-Request-Method": "GET"})
        assert "Access-Control-Allow-Origin" not in headers


def test_the_token_of_a_real_launch_reads_what_its_scope_grants(live, runtime, world):
    """launch -> authorize -> token over HTTP, as an app does; the scope is what that flow grants."""
    from hub.sandbox import issue_sandbox_token
    from oauth.smart_scopes import access
    sandbox = issue_sandbox_token(as_service(runtime, live), world.physician)
    status, _, body = http("POST", f"{live}/v1/sandbox/launches", json.dumps({"client_id": world.app.client_id}).encode(),
                           {"Authorization": f"Bearer {sandbox}", "Content-Type": "application/json"})
    assert status == 201, body
    query = {"client_id": world.app.client_id, "redirect_uri": world.app.redirect_uri, "response_type": "code",
             "launch_id": json.loads(body)["launch_id"]}
    status, headers, body = http("GET", f"{live}/v1/oauth/authorize?{urllib.parse.urlencode(query)}")
    assert status == 302, body
    code = urllib.parse.parse_qs(urllib.parse.urlsplit(headers["Location"]).query)["code"][0]
    status, _, body = http("POST", f"{live}/v1/oauth/token", json.dumps({
        "grant_type": "authorization_code", "client_id": world.app.client_id, "client_secret": world.secret,
        "code": code}).encode(), {"Content-Type": "application/json"})
    assert status == 200, body
    tokens = json.loads(body)
    fhir = Fhir(live, world.org.id, tokens["access_token"])
    granted = access(tokens.get("scope"), "Practitioner", "r")
    status, _, body = fhir.get(f"/Practitioner/{world.physician.id}")
    if granted.allowed:
        assert status == 200 and body["identifier"][0]["value"] == world.physician.npi
    else:
        assert status == 403 and outcome(body) == "forbidden", (tokens.get("scope"), body)
    # Whatever was granted, the token is the clinic's only.
    other, _ = clinic("Elsewhere", "https://ehr.example/elsewhere")
    assert Fhir(live, other.id, tokens["access_token"]).get("/Patient")[0] == 404


def test_a_revoked_token_is_refused_at_once_though_its_verification_is_kept(live, runtime, world):
    """The serve process remembers a token's verification (oauth/tokens.py) across FHIR reads; the
    deny-list is still asked on every request, so the first read after revocation is a 401 (issue 35 item 6)."""
    from helpers.http import basic_auth
    token = mint_platform_token(runtime, live, world.physician, world.app, world.org.id)
    fhir = Fhir(live, world.org.id, token)
    for _ in range(2):  # the second read uses the kept verification
        assert fhir.get("/Patient", {"_count": 1})[0] == 200
    status, _, _ = http("POST", f"{live}/v1/oauth/revoke", urllib.parse.urlencode({"token": token}).encode(),
                        {"Content-Type": "application/x-www-form-urlencoded",
                         "Authorization": basic_auth(world.app.client_id, world.secret)})
    assert status == 200
    status, headers, body = fhir.get("/Patient", {"_count": 1})
    assert status == 401 and 'error="invalid_token"' in headers["WWW-Authenticate"] and outcome(body) == "login"


def test_another_writers_change_to_the_directory_is_seen_by_the_next_request(live, runtime, world):
    """The serve process keeps the bearer gate's users in memory (`app_cache.directory`, issue 35
    item 6). A change made by another writer (here this test's own connection, as another process,
    an older release or an operator's SQL would) reaches the very next request: the database's
    trigger moves the `directory` version in the writer's transaction."""
    token = mint_platform_token(runtime, live, world.physician, world.app, world.org.id)
    fhir = Fhir(live, world.org.id, token)
    for _ in range(2):  # the second read is answered from memory
        assert fhir.get("/Patient", {"_count": 1})[0] == 200
    Installation.update(activation_status="Disabled").where(
        (Installation.application == world.app.id) & (Installation.organization == world.org.id)).execute()
    status, _, body = fhir.get("/Patient", {"_count": 1})
    assert status == 403 and outcome(body) == "forbidden"
    Installation.update(activation_status="Enabled").where(
        (Installation.application == world.app.id) & (Installation.organization == world.org.id)).execute()
    assert fhir.get("/Patient", {"_count": 1})[0] == 200
    elsewhere, _ = clinic("Elsewhere Clinic", "https://ehr.example/elsewhere")
    User.update(organization=elsewhere.id).where(User.id == world.physician.id).execute()
    status, headers, body = fhir.get("/Patient", {"_count": 1})
    assert status == 401 and 'error="invalid_token"' in headers["WWW-Authenticate"] and outcome(body) == "login"


def test_every_request_sent_after_another_writers_change_sees_it_among_concurrent_reads(live, runtime, world):
    """Requests that arrive together share one read of the change versions (`models.changes.Versions`),
    and a read serves only requests that had arrived before it began: with readers on 6 connections
    all the time, every request sent after an installation was disabled (by another writer) and
    answered before it was enabled again is refused, cycle after cycle."""
    from lifecycle.applications import set_fhir_rate_limits
    from ratelimit.policy import Limit
    set_fhir_rate_limits(runtime, world.app.id, fhir_rate_limit=Limit(100000, 60), fhir_token_rate_limit=Limit(100000, 60))
    token = mint_platform_token(runtime, live, world.physician, world.app, world.org.id)
    seen: list = []  # (sent, answered, status)
    stop = threading.Event()

    def reader():
        fhir = Fhir(live, world.org.id, token)
        while not stop.is_set():
            sent = time.monotonic()
            status = fhir.get("/Patient", {"_count": 1})[0]
            seen.append((sent, time.monotonic(), status))

    def installation(status: str) -> None:
        Installation.update(activation_status=status).where(
            (Installation.application == world.app.id) & (Installation.organization == world.org.id)).execute()

    readers = [threading.Thread(target=reader) for _ in range(6)]
    for thread in readers:
        thread.start()
    windows = []
    try:
        for _ in range(6):
            time.sleep(0.15)
            installation("Disabled")
            disabled = time.monotonic()
            time.sleep(0.15)
            enabling = time.monotonic()
            installation("Enabled")
            windows.append((disabled, enabling))
    finally:
        stop.set()
        for thread in readers:
            thread.join(30)
    inside = [status for sent, answered, status in seen
              if any(start <= sent and answered <= end for start, end in windows)]
    assert len(inside) >= 30, len(inside)  # enough requests inside the windows for the check to mean something
    assert set(inside) == {403}, sorted(set(inside))
    assert {status for _, _, status in seen} == {200, 403}


def test_one_read_of_the_versions_serves_only_work_asked_for_before_it_began(runtime, world):
    """`Versions`: work asked for before a read began may use that read; work asked for after a
    change (here another writer's) gets a read begun after it, whatever was read before."""
    from models.changes import DIRECTORY, Versions
    versions = Versions()
    asked = versions.mark()
    versions.begin(asked)
    first = versions.of(DIRECTORY)
    versions.end()
    User.update(given_name="Changed").where(User.id == world.physician.id).execute()
    versions.begin(asked)  # asked for before the first read began: that read serves it
    assert versions.of(DIRECTORY) == first
    versions.end()
    versions.begin()  # asked for now, after the change
    assert versions.of(DIRECTORY) > first
    versions.end()


def test_every_write_to_users_organizations_and_installations_moves_the_directory_version(runtime, world):
    """Migration 3505's triggers, on both databases: INSERT, UPDATE and DELETE of each table (and
    a denial moves the `denied` version, not the directory's)."""
    from models.changes import DENIED, DIRECTORY, Versions
    version_of = Versions().of  # outside a unit of work: read anew on every call
    from models.denylist import DeniedToken
    from models.directory import Organization

    def moved(write, topic: str = DIRECTORY) -> bool:
        before = version_of(topic)
        write()
        return version_of(topic) > before

    other, _ = clinic("Version Clinic", "https://ehr.example/version", ("first@clinic.example", "Fi", "Rst", "first",
                                                                    "1245319599"))
    assert moved(lambda: Organization.update(name="Renamed").where(Organization.id == other.id).execute())
    user = create_user(other.id, "version@clinic.example", "Vera", "Sion", "vsion", "1234567893")
    assert moved(lambda: User.update(given_name="Vee").where(User.id == user.id).execute())
    assert moved(lambda: install_application(world.app.id, other.id))
    assert moved(lambda: Installation.delete().where(Installation.organization == other.id).execute())
    assert moved(lambda: User.delete().where(User.id == user.id).execute())
    assert moved(lambda: create_user(other.id, "again@clinic.example", "A", "Gain", "again", "1234567893"))
    assert not moved(lambda: Application.update(name="Not the directory").where(Application.id == world.app.id).execute())
    assert moved(lambda: DeniedToken.insert(jti="a-denied-jti", expires_at=2**40).execute(), DENIED)
    assert not moved(lambda: DeniedToken.insert(jti="another-jti", expires_at=2**40).execute())


def test_a_denial_added_by_another_writer_is_seen_by_the_next_request(live, runtime, world):
    """The serve process keeps what the database deny-list answered for a token while the `denied`
    version stands still (issue 35 item 6); a denial written by anyone moves it (migration 3505)."""
    from jose import jwt
    from models.denylist import DeniedToken
    token = mint_platform_token(runtime, live, world.physician, world.app, world.org.id)
    fhir = Fhir(live, world.org.id, token)
    for _ in range(2):  # the second read is answered from memory
        assert fhir.get("/Patient", {"_count": 1})[0] == 200
    claims = jwt.get_unverified_claims(token)
    DeniedToken.insert(jti=claims["jti"], expires_at=claims["exp"]).execute()
    status, headers, body = fhir.get("/Patient", {"_count": 1})
    assert status == 401 and 'error="invalid_token"' in headers["WWW-Authenticate"] and outcome(body) == "login"
