"""Inputs that used to get a 500 and a traceback: deep JSON, a garbled Basic header, NUL and lone surrogates."""
from __future__ import annotations

import json
import urllib.parse

import pytest

from helpers.rest import partner_headers

INVITE = {"email": "ann@clinic.example", "given_name": "Ann", "family_name": "Example",
          "organization_name": "Ann's Clinic"}


def nested(depth: int) -> str:
    return '{"grant_type": ' + "[" * depth + "]" * depth + "}"


@pytest.mark.gen_test
@pytest.mark.parametrize("depth", [1000, 20000])
async def test_deeply_nested_json_is_400_invalid_request(api, world, depth, caplog):
    status, _, body = await api.call("POST", "/v1/oauth/token", body=nested(depth),
                                     headers={"Content-Type": "application/json"})
    assert status == 400 and body["error"] == "invalid_request" and "nested" in body["message"]
    headers = await partner_headers(api, world.app, world.secret)
    status, _, body = await api.call("POST", "/v1/invitations", body=nested(depth),
                                     headers={**headers, "Content-Type": "application/json"})
    assert status == 400 and body["error"] == "invalid_request"
    assert "Traceback" not in caplog.text


@pytest.mark.gen_test
async def test_moderate_nesting_inside_strings_is_fine(api, world):
    # Brackets inside strings do not count as nesting.
    status, _, body = await api.call("POST", "/v1/oauth/token", {
        "grant_type": "client_credentials", "client_id": world.app.client_id,
        "client_secret": world.secret, "note": "[" * 100})
    assert status == 200, body


@pytest.mark.gen_test
async def test_a_member_repeated_in_a_json_body_is_refused_naming_it(api, world, runtime, caplog):
    """A repeated member is refused as a repeated form or query parameter is, never taken last-wins:
    `{"client_id": "a", "client_id": "b"}` must not authenticate as "b"."""
    from lifecycle.applications import register_application
    other, _ = register_application(runtime, "Other", "https://o.example/cb", "https://o.example/l")
    raw = ('{"grant_type": "client_credentials", "client_id": "%s", "client_id": "%s", "client_secret": "%s"}'
           % (other.client_id, world.app.client_id, world.secret))
    status, _, body = await api.call("POST", "/v1/oauth/token", body=raw, headers={"Content-Type": "application/json"})
    assert status == 400 and body["error"] == "invalid_request", body
    assert "client_id" in body["error_description"] and "more than once" in body["error_description"]
    # The same request as a form is refused alike (the rule JSON now follows).
    form = urllib.parse.urlencode([("grant_type", "client_credentials"), ("client_id", other.client_id),
                                   ("client_id", world.app.client_id), ("client_secret", world.secret)])
    status, _, body = await api.call("POST", "/v1/oauth/token", body=form,
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 400 and body["error"] == "invalid_request" and "client_id" in body["message"]
    # The partner API (JSON only), at any depth of the document.
    headers = {**await partner_headers(api, world.app, world.secret), "Content-Type": "application/json"}
    for raw in ('{"email": "a@clinic.example", "email": "b@clinic.example", "given_name": "Ann", '
                '"family_name": "Example", "organization_name": "Ann\'s Clinic"}',
                '{"email": "a@clinic.example", "given_name": "Ann", "given_name": "Bea"}'):
        status, _, body = await api.call("POST", "/v1/invitations", body=raw, headers=headers)
        assert status == 400 and body["error"] == "invalid_request", body
        assert "more than once" in body["message"], body
    status, _, body = await api.call("POST", "/v1/invitations", body='{"email": {"x": 1, "x": 2}}', headers=headers)
    assert status == 400 and body["error"] == "invalid_request" and '"x"' in body["message"], body
    assert "Traceback" not in caplog.text


@pytest.mark.gen_test
@pytest.mark.parametrize("value", ["Basic \xff\xfe", "Basic \u00e9t\u00e9", "Basic ////", "Basic AA==",
                                   "Basic " + "YQBiOmM=",  # "a\0b:c"
                                   ])
async def test_malformed_basic_header_is_invalid_client(api, value):
    status, headers, body = await api.call("POST", "/v1/oauth/token", body="grant_type=client_credentials",
                                           headers={"Content-Type": "application/x-www-form-urlencoded",
                                                    "Authorization": value})
    assert status == 401 and body["error"] == "invalid_client", body
    assert headers["WWW-Authenticate"].startswith("Basic")


@pytest.mark.gen_test
@pytest.mark.parametrize("bad", ["a\u0000b", "x\ud800y", "\udfff"])
async def test_nul_and_lone_surrogates_are_refused_naming_the_field(api, world, bad, caplog):
    headers = await partner_headers(api, world.app, world.secret)
    for field in ("given_name", "organization_name", "email"):
        raw = json.dumps({**INVITE, field: bad})  # ensure_ascii: "\u0000" / "\ud800" escapes
        status, _, body = await api.call("POST", "/v1/invitations", body=raw,
                                         headers={**headers, "Content-Type": "application/json"})
        assert status == 400 and body["error"] == "invalid_request", body
        assert field in body["message"]
    # The same rule at the OAuth endpoints, in JSON, forms and query strings.
    status, _, body = await api.call("POST", "/v1/oauth/token", body=json.dumps({
        "grant_type": "client_credentials", "client_id": bad, "client_secret": "x"}),
        headers={"Content-Type": "application/json"})
    assert status == 400 and "client_id" in body["message"]
    status, _, body = await api.call("POST", "/v1/oauth/introspect", body="token=a%00b",
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 400 and "token" in body["message"]
    status, _, body = await api.call("GET", "/v1/oauth/authorize?client_id=a%00b&response_type=code",
                                     headers={"Accept": "application/json"})
    assert status == 400 and "client_id" in body["message"]
    assert "Traceback" not in caplog.text


@pytest.mark.gen_test
async def test_overlong_client_ids_are_never_remembered(api, runtime, world):
    """Unknown client_ids are remembered by the application cache (up to 10,000), but one longer than
    any client_id can be (64) is neither looked up nor kept: authorize and the CORS look-up of the
    token, revocation and introspection endpoints (made before authentication) kept each one whole,
    so 10,000 unauthenticated requests of 64 KiB held 640 MB in every process."""
    origin = {"Origin": "https://anywhere.example"}
    for n in range(3):
        client_id = f"{n}" + "x" * 60_000
        query = urllib.parse.urlencode({"client_id": client_id, "redirect_uri": world.app.redirect_uri,
                                        "response_type": "code", "launch_id": "x"})
        status, _, body = await api.call("GET", f"/v1/oauth/authorize?{query}", headers={"Accept": "application/json"})
        assert status == 400 and body["error"] == "invalid_client"
        for path in ("/v1/oauth/token", "/v1/oauth/revoke", "/v1/oauth/introspect"):
            status, _, body = await api.call("POST", path, {"grant_type": "client_credentials", "token": "t",
                                                            "client_id": client_id + path, "client_secret": "s"},
                                             headers=origin)
            assert status == 401 and body["error"] == "invalid_client", (path, body)
    assert max((len(key) for _, key in runtime.applications._missing), default=0) <= 64


@pytest.mark.gen_test
async def test_a_post_search_form_with_raw_nul_or_non_utf8_bytes_is_a_recorded_400(api, runtime, world):
    """A FHIR `POST {Type}/_search` form is recorded with the query string (the query's, then the
    form's). A raw NUL byte in the form went into the record as is: PostgreSQL refuses NUL in text,
    so the request got 503 `transient` (retry: the same 503 forever) and no record. The form's bytes
    that a query string cannot hold raw are recorded percent-encoded, as a GET's query has them."""
    from helpers.tokens import mint_platform_token
    from models.disclosures import DisclosureRecord
    token = mint_platform_token(runtime, None, world.physician, world.app, world.org)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/x-www-form-urlencoded"}
    path = f"/fhir/r4/{world.org.id}/Patient/_search"
    cases = {b"name=a\x00b": (400, "name=a%00b"), b"_count=2&x=\x00\x1f": (400, "_count=2&x=%00%1F"),
             b"_count=2&\x00=1": (200, "_count=2&%00=1"), b"_count=2&x=\xff": (400, "_count=2&x=%FF"),
             "_count=2&name=Zoë z".encode(): (200, "_count=2&name=Zo%C3%AB%20z")}
    for body, (expected, _) in cases.items():
        status, _, answer = await api.call("POST", path, body=body, headers=headers)
        assert status == expected, (body, status, answer)
        assert answer["resourceType"] == ("Bundle" if status == 200 else "OperationOutcome")
    rows = list(DisclosureRecord.select().where(DisclosureRecord.action == "search").order_by(DisclosureRecord.seq))
    assert [(r.status, r.query) for r in rows] == list(cases.values())
    # As a GET of the same search records it.
    status, _, _ = await api.call("GET", f"/fhir/r4/{world.org.id}/Patient?_count=2&name=Zo%C3%AB%20z",
                                  headers={"Authorization": f"Bearer {token}"})
    assert status == 200
    last = DisclosureRecord.select().order_by(DisclosureRecord.seq.desc()).get()
    assert last.query == rows[-1].query


@pytest.mark.gen_test
async def test_a_post_search_form_of_any_media_type_spelling_is_searched_as_sent(api, runtime, world):
    """A media type is case-insensitive (RFC 9110 8.3.1): `POST {Type}/_search` accepted a form sent
    as `Application/X-WWW-Form-Urlencoded`, but only Tornado's lower-case spelling had its body
    parsed, so its parameters were dropped without a word: `patient=A` answered every patient's
    Observations (the `self` link without it), and a form with a Content-Encoding was searched as
    nothing at all. Every spelling is the same search; an encoded form is a 4xx, as it is in lower case."""
    from connectors.compartment import patients_of
    from helpers.tokens import mint_platform_token
    token = mint_platform_token(runtime, None, world.physician, world.app, world.org)
    path = f"/fhir/r4/{world.org.id}/Observation/_search"
    status, _, first = await api.call("GET", f"/fhir/r4/{world.org.id}/Observation?_count=1",
                                      headers={"Authorization": f"Bearer {token}"})
    patient = patients_of(first["entry"][0]["resource"])[0]
    form = f"patient={patient}&_count=100".encode()
    for spelling in ("application/x-www-form-urlencoded", "Application/X-WWW-Form-Urlencoded",
                     "APPLICATION/X-WWW-FORM-URLENCODED; charset=UTF-8"):
        status, _, bundle = await api.call("POST", path, body=form, headers={
            "Authorization": f"Bearer {token}", "Content-Type": spelling})
        assert status == 200 and bundle["entry"], (spelling, bundle)
        assert {p for e in bundle["entry"] for p in patients_of(e["resource"])} == {patient}, spelling
        assert f"patient={patient}" in bundle["link"][0]["url"], spelling
        status, _, body = await api.call("POST", path, body=form, headers={
            "Authorization": f"Bearer {token}", "Content-Type": spelling, "Content-Encoding": "gzip"})
        assert 400 <= status < 500 and body["resourceType"] == "OperationOutcome", (spelling, status, body)


def _path_rules(router):
    """Every path rule of `router` and the routers under it: (regex, handler class)."""
    for rule in router.rules:
        if hasattr(rule.target, "rules"):
            yield from _path_rules(rule.target)
        elif getattr(rule.matcher, "regex", None) is not None:
            yield rule.matcher, rule.target


@pytest.mark.gen_test(timeout=120)
async def test_every_route_with_a_percent_encoded_segment_is_never_a_500(app, api, world, base_url, http_client):
    """Tornado decodes a route's captured segments but not `request.path`: the Bulk Data kick-off cut
    its URL at the decoded clinic id and answered 500 to `/fhir/r4/%61bc/$export`, before any token.
    Each route with segments, each captured one sent percent-encoded (the clinic's id, a plain word,
    one encoded twice, a NUL), by GET, POST and DELETE without credentials: a 4xx, never a 500."""
    org = world.org.id
    values = ["%" + format(ord(org[0]), "02X") + org[1:], "%78", "%2578", "%00", "%C3%A9"]
    tried = 0
    for matcher, handler in _path_rules(app.wildcard_router):
        groups = matcher.regex.groups
        if not groups:
            continue
        for value in values:
            path = matcher.reverse(*(["SEGMENT"] * groups)).replace("SEGMENT", value)  # reverse() would escape it
            for method in ("GET", "POST", "DELETE"):
                response = await http_client.fetch(base_url + path, method=method, raise_error=False,
                                                   body=b"{}" if method == "POST" else None,
                                                   headers={"Accept": "application/fhir+json", "Prefer": "respond-async",
                                                            "Content-Type": "application/json"})
                assert response.code < 500, (method, path, handler.__name__, response.code, response.body[:300])
                tried += 1
    assert tried > 300
