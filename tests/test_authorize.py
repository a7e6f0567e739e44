"""GET and POST /oauth/authorize: the redirect_uri rule, launch rules, and error delivery (RFC 6749 4.1.2.1)."""
import json
import urllib.parse

import pytest
from jose import jwt

from models.grants import Launch
from oauth.redirects import redirect_uri_allowed

REGISTERED = "https://app.example.com/main"


@pytest.mark.parametrize("candidate", [
    "https://app.example.com/main",
    "https://app.example.com/main/",
    "https://app.example.com/main/tenant/42?x=1",
    "https://APP.example.com:443/main",
])
def test_redirect_uri_under_registered_base_is_allowed(candidate):
    assert redirect_uri_allowed(candidate, REGISTERED)


@pytest.mark.parametrize("candidate", [
    "https://app.example.com.evil.com/main",   # look-alike host
    "https://evil.com/app.example.com/main",
    "https://app.example.com:8443/main",       # another port
    "https://app.example.com/mainx",           # shares only a string prefix
    "https://app.example.com/main-evil/x",
    "http://app.example.com/main",             # scheme change
    "https://user@app.example.com/main",       # userinfo
    "https://app.example.com/main/../admin",   # path traversal
    "https://app.example.com/main#frag",
    "//app.example.com/main",
    "",
])
def test_redirect_uri_outside_registered_base_is_refused(candidate):
    assert not redirect_uri_allowed(candidate, REGISTERED)


def location_query(headers) -> dict:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(headers["Location"]).query))


@pytest.mark.gen_test
async def test_bad_redirect_uri_is_shown_never_redirected(flow):
    for uri in ("https://app.example.com.evil.com/main", "https://app.example.com/mainx",
                "http://app.example.com/main", "https://app.example.com:444/main"):
        status, headers, body = await flow.authorize(redirect_uri=uri)
        assert status == 400 and "Location" not in headers, uri


@pytest.mark.gen_test
async def test_unknown_client_is_shown_never_redirected(api, world):
    query = urllib.parse.urlencode({"client_id": "nope", "redirect_uri": world.app.redirect_uri,
                                    "response_type": "code", "launch_id": "x"})
    status, headers, body = await api.call("GET", f"/v1/oauth/authorize?{query}", headers={"Accept": "application/json"})
    assert status == 400 and "Location" not in headers
    assert body["error"] == "invalid_client"


@pytest.mark.gen_test
async def test_the_authorize_error_page_sends_the_security_headers_of_every_html_page(api, world):
    """The page shown when the client or redirect_uri cannot be trusted (so nothing is redirected)
    is HTML that echoes the request's fault: it sent no Content-Security-Policy and could be framed."""
    query = urllib.parse.urlencode({"client_id": "<script>alert(1)</script>", "redirect_uri": world.app.redirect_uri,
                                    "response_type": "code", "launch_id": "x"})
    status, headers, body = await api.call("GET", f"/v1/oauth/authorize?{query}", headers={"Accept": "text/html"})
    assert status == 400 and headers["Content-Type"].startswith("text/html") and "<script>" not in body
    directives = dict((d.strip().split(" ", 1) + [""])[:2] for d in headers["Content-Security-Policy"].split(";"))
    assert directives["default-src"] == "'none'" and directives["frame-ancestors"] == "'none'"
    assert directives["base-uri"] == "'none'" and directives["form-action"] == "'none'"
    assert headers["X-Frame-Options"] == "DENY" and headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Referrer-Policy"] == "no-referrer" and headers["Cache-Control"] == "no-store"


@pytest.mark.gen_test
async def test_redirect_uri_below_base_gets_the_code(flow, world):
    status, headers, _ = await flow.authorize(redirect_uri="https://app.example.com/main/clinic/7")
    assert status == 302
    assert headers["Location"].startswith("https://app.example.com/main/clinic/7?code=")


@pytest.mark.gen_test
async def test_unsupported_response_type_is_redirected_with_error_and_state(flow):
    status, headers, _ = await flow.authorize(response_type="token", state="s1")
    assert status == 302
    query = location_query(headers)
    assert query["error"] == "unsupported_response_type" and query["state"] == "s1" and "code" not in query


@pytest.mark.gen_test
async def test_a_response_mode_other_than_query_is_refused_and_the_launch_kept(flow):
    """response_mode=fragment, form_post or JARM's query.jwt got a code in the query all the same:
    the client asked for its response elsewhere (or signed) and was answered unsigned in the query,
    where it does not look for it and where it lands in server logs. Now invalid_request (with the
    state), the launch still usable; response_mode=query is what is always done."""
    launch_id = await flow.launch()
    for mode in ("fragment", "form_post", "query.jwt", "jwt", "QUERY"):
        status, headers, _ = await flow.authorize(launch_id=launch_id, response_mode=mode, state="s1")
        assert status == 302, mode
        query = location_query(headers)
        assert query["error"] == "invalid_request" and "response_mode" in query["error_description"], (mode, query)
        assert query["state"] == "s1" and "code" not in query and query["iss"]
    status, headers, _ = await flow.authorize(launch_id=launch_id, response_mode="query", state="s2")
    assert status == 302 and "code" in location_query(headers) and location_query(headers)["state"] == "s2"


@pytest.mark.gen_test
async def test_id_token_hint_names_the_user_the_launch_must_be_for(flow, world, runtime):
    """OIDC Core 3.1.2.1: id_token_hint was ignored, so a client that sent its signed-in user's ID
    token (prompt=none, to stay with that user) got a code for whoever the launch was for, and a
    hint that was no ID token at all passed too. A hint naming another user is login_required (the
    launch kept for a request without it); one that is not an ID token this server issued to this
    client is invalid_request; the user's own ID token, even expired, gets the code."""
    from hub.sandbox import issue_sandbox_token
    from lifecycle.applications import install_application, register_application
    status, _, tokens = await flow.exchange(await flow.code())
    hint = tokens["id_token"]
    staff_launch = await flow.launch(sandbox_token=world.staff_sandbox_token)
    status, headers, _ = await flow.authorize(launch_id=staff_launch, id_token_hint=hint, prompt="none", state="s1")
    query = location_query(headers)
    assert status == 302 and query["error"] == "login_required" and query["state"] == "s1" and "code" not in query
    other, other_secret = register_application(runtime, "Other", "https://other.example/cb", "https://other.example/launch")
    install_application(other.id, world.org.id)
    other_launch = await flow.launch(client_id=other.client_id)
    status, headers, _ = await flow.authorize(client_id=other.client_id, redirect_uri=other.redirect_uri,
                                              launch_id=other_launch)
    status, _, other_tokens = await flow.api.call("POST", "/v1/oauth/token", {
        "grant_type": "authorization_code", "client_id": other.client_id, "client_secret": other_secret,
        "code": location_query(headers)["code"]})
    for bad in ("garbage", "a.b.c", tokens["access_token"], other_tokens["id_token"],
                issue_sandbox_token(runtime, world.physician)):
        status, headers, _ = await flow.authorize(launch_id=staff_launch, id_token_hint=bad)
        query = location_query(headers)
        assert status == 302 and query["error"] == "invalid_request" and "id_token_hint" in query["error_description"]
    status, headers, _ = await flow.authorize(launch_id=staff_launch)
    assert "code" in location_query(headers)  # the staff user's launch was never spent
    runtime.clock.advance(runtime.settings.id_token_ttl + 60)  # the hint has expired: still the physician's
    status, headers, _ = await flow.authorize(id_token_hint=hint, prompt="none", state="s2")
    query = location_query(headers)
    assert status == 302 and query["state"] == "s2" and "code" in query, query
    status, _, fresh = await flow.exchange(query["code"])
    assert jwt.get_unverified_claims(fresh["id_token"])["sub"] == world.physician.id


@pytest.mark.gen_test
async def test_missing_launch_id_is_redirected_as_invalid_request(flow, world):
    status, headers, _ = await flow.authorize(launch_id="")
    assert status == 302 and location_query(headers)["error"] == "invalid_request"


@pytest.mark.gen_test
async def test_launch_is_single_use(flow):
    launch_id = await flow.launch()
    first = await flow.authorize(launch_id=launch_id)
    second = await flow.authorize(launch_id=launch_id)
    assert "code" in location_query(first[1])
    assert location_query(second[1])["error"] == "invalid_request"


@pytest.mark.gen_test
async def test_launch_expires_after_five_minutes(flow, runtime):
    launch_id = await flow.launch()
    runtime.clock.advance(runtime.settings.launch_ttl + 1)  # SVC_LAUNCH_TTL, 300 s
    status, headers, _ = await flow.authorize(launch_id=launch_id)
    assert location_query(headers)["error"] == "invalid_request"


@pytest.mark.gen_test
async def test_launch_just_before_expiry_still_works(flow, runtime):
    launch_id = await flow.launch()
    runtime.clock.advance(runtime.settings.launch_ttl - 1)
    status, headers, _ = await flow.authorize(launch_id=launch_id)
    assert "code" in location_query(headers)


@pytest.mark.gen_test
async def test_launch_is_bound_to_its_client(flow, world, runtime):
    from lifecycle.applications import install_application, register_application
    other, _ = register_application(runtime, "Other", "https://other.example/cb", "https://other.example/launch")
    install_application(other.id, world.org.id)
    launch_id = await flow.launch(client_id=other.client_id)
    status, headers, _ = await flow.authorize(launch_id=launch_id)
    assert location_query(headers)["error"] == "invalid_request"
    assert Launch.get_by_id(launch_id).used_at is None  # the other client's launch is not burnt


@pytest.mark.gen_test
async def test_login_hint_is_accepted_as_launch_id(flow):
    launch_id = await flow.launch()
    status, headers, _ = await flow.authorize(login_hint=launch_id)
    assert "code" in location_query(headers)


@pytest.mark.gen_test
async def test_both_variants_serve_authorize(flow):
    status, headers, _ = await flow.authorize(prefix="/os-api/v2")
    assert status == 302 and "code" in location_query(headers)


@pytest.mark.gen_test
async def test_an_overlong_nonce_is_refused_and_the_launch_kept(flow):
    """A nonce longer than a code can carry (500 characters) is invalid_request, redirected with the
    state; it was a 500 on PostgreSQL, after the launch had been spent. 500 characters still work,
    and reach the ID token."""
    launch_id = await flow.launch()
    status, headers, _ = await flow.authorize(launch_id=launch_id, nonce="n" * 501, state="s1")
    assert status == 302
    query = location_query(headers)
    assert query["error"] == "invalid_request" and "nonce" in query["error_description"] and query["state"] == "s1"
    status, headers, _ = await flow.authorize(launch_id=launch_id, nonce="n" * 500)
    status, _, body = await flow.exchange(location_query(headers)["code"])
    assert status == 200 and jwt.get_unverified_claims(body["id_token"])["nonce"] == "n" * 500


@pytest.mark.gen_test
async def test_a_max_age_of_digits_that_are_not_ascii_is_invalid_request(flow):
    """`max_age=²` (a digit to `str.isdigit`, not to `int`) is invalid_request, not a 500."""
    launch_id = await flow.launch()
    for value in ("\u00b2", "\u0663\u0660", "60\u00b2"):
        status, headers, _ = await flow.authorize(launch_id=launch_id, max_age=value, state="s1")
        assert status == 302, (value, status)
        query = location_query(headers)
        assert query["error"] == "invalid_request" and "max_age" in query["error_description"], query


@pytest.mark.gen_test
async def test_an_overlong_redirect_uri_is_shown_never_redirected(flow, world):
    """A redirect_uri under the base but longer than a code can be bound to (1000 characters) is
    shown as an error (it was a 500 on PostgreSQL, after the launch had been spent); 1000 work."""
    base = world.app.redirect_uri + "/"
    launch_id = await flow.launch()
    status, headers, _ = await flow.authorize(launch_id=launch_id, redirect_uri=base + "a" * (1001 - len(base)))
    assert status == 400 and "Location" not in headers
    status, headers, _ = await flow.authorize(launch_id=launch_id, redirect_uri=base + "a" * (1000 - len(base)))
    assert status == 302 and "code" in location_query(headers)


@pytest.mark.gen_test
async def test_an_overlong_state_is_shown_and_the_launch_kept(flow):
    """The response carries the state back: one over 2048 characters once %-encoded made a Location
    the shipped nginx does not pass on (502, after the launch was spent; tests/test_nginx.py). It is
    shown as an error, never redirected, and the launch stays usable; 2048 still work."""
    launch_id = await flow.launch()
    status, headers, _ = await flow.authorize(launch_id=launch_id, state="/" * 683)  # 2049 once encoded
    assert status == 400 and "Location" not in headers
    status, headers, _ = await flow.authorize(launch_id=launch_id, state="/" * 682 + "ab")  # 2048
    assert status == 302 and location_query(headers)["state"] == "/" * 682 + "ab" and "code" in location_query(headers)


@pytest.mark.gen_test
async def test_an_error_description_in_a_redirect_is_short_printable_ascii(flow):
    """RFC 6749 4.1.2.1: error_description is printable ASCII without `"` or `\\`; a refused scope
    was echoed as asked (any Unicode, 300 characters: up to 2700 bytes once encoded)."""
    status, headers, _ = await flow.authorize(scope="\u00e9\"\\" * 100)
    assert status == 302
    description = location_query(headers)["error_description"]
    assert location_query(headers)["error"] == "invalid_scope" and len(description) <= 500
    assert all(0x20 <= ord(c) <= 0x7E and c not in '"\\' for c in description), description


# -- POST (OIDC Core 3.1.2.1: GET and POST; SMART's `authorize-post`) ---------------------------

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


async def post_authorize(api, path="/v1/oauth/authorize", body=b"", headers=None):
    return await api.call("POST", path, body=body, headers={**FORM, **(headers or {})})


def form_of(world, launch_id, **extra) -> dict:
    return {"client_id": world.app.client_id, "redirect_uri": world.app.redirect_uri, "response_type": "code",
            "launch_id": launch_id, **extra}


@pytest.mark.gen_test
@pytest.mark.parametrize("prefix", ["/v1", "/os-api/v2"])
async def test_authorize_by_post_issues_a_code_as_get_does(flow, world, prefix):
    """A form POST answered 405: OIDC Core 3.1.2.1 says an authorization server MUST support POST.
    It redirects with 303 (RFC 9700 4.12: the browser then GETs redirect_uri, never re-posts)."""
    status, headers, _ = await flow.authorize(prefix, method="POST", state="s-post", nonce="n1")
    assert status == 303, headers
    query = location_query(headers)
    assert headers["Location"].startswith(world.app.redirect_uri + "?")
    assert query["state"] == "s-post" and query["code"] and query["iss"]
    assert headers["Cache-Control"] == "no-store"
    status, _, tokens = await flow.exchange(query["code"], prefix)
    assert status == 200, tokens
    claims = jwt.get_unverified_claims(tokens["id_token"])
    assert claims["sub"] == world.physician.id and claims["nonce"] == "n1"


@pytest.mark.gen_test
async def test_authorize_by_post_keeps_every_check_of_get(flow, world, runtime):
    """The same checks, errors and launch binding as GET: a spent launch, another client's launch,
    a plain PKCE challenge, a bad response_type are redirected errors; an unknown client or a
    redirect_uri outside the registration is shown, never redirected."""
    launch_id = await flow.launch()
    status, headers, _ = await flow.authorize(method="POST", launch_id=launch_id)
    assert status == 303 and "code" in location_query(headers)
    status, headers, _ = await flow.authorize(method="POST", launch_id=launch_id, state="again")
    assert status == 303 and location_query(headers)["error"] == "invalid_request"
    assert location_query(headers)["state"] == "again" and "code" not in location_query(headers)
    status, headers, _ = await flow.authorize(method="POST", code_challenge="x" * 43, code_challenge_method="plain")
    assert status == 303 and location_query(headers)["error"] == "invalid_request"
    status, headers, _ = await flow.authorize(method="POST", response_type="token")
    assert status == 303 and location_query(headers)["error"] == "unsupported_response_type"
    for bad in ({"redirect_uri": "https://app.example.com.evil.com/main"}, {"client_id": "nope"}):
        status, headers, _ = await flow.authorize(method="POST", **bad)
        assert status == 400 and "Location" not in headers, bad
    from lifecycle.applications import install_application, register_application
    other, _ = register_application(runtime, "Other", "https://other.example/cb", "https://other.example/launch")
    install_application(other.id, world.org.id)
    launch_id = await flow.launch(client_id=other.client_id)
    status, headers, _ = await flow.authorize(method="POST", launch_id=launch_id)
    assert status == 303 and location_query(headers)["error"] == "invalid_request"
    assert Launch.get_by_id(launch_id).used_at is None  # the other client's launch is not burnt


@pytest.mark.gen_test
async def test_authorize_by_post_binds_pkce_to_the_code(flow, world):
    from oauth.pkce import s256
    verifier = "v" * 50
    status, headers, _ = await flow.authorize(method="POST", code_challenge=s256(verifier),
                                              code_challenge_method="S256")
    assert status == 303
    code = location_query(headers)["code"]
    status, _, body = await flow.exchange(code, code_verifier="w" * 50)
    assert status == 400 and body["error"] == "invalid_grant"
    status, headers, _ = await flow.authorize(method="POST", code_challenge=s256(verifier),
                                              code_challenge_method="S256")
    status, _, body = await flow.exchange(location_query(headers)["code"], code_verifier=verifier)
    assert status == 200, body


@pytest.mark.gen_test
async def test_a_parameter_in_both_the_query_and_the_body_is_refused(flow, world, api):
    """Never last-wins: a parameter in both the query and the form (even with the same value) is a
    400, never redirected, and the launch is kept."""
    launch_id = await flow.launch()
    form = form_of(world, launch_id)
    for name, value in (("launch_id", launch_id), ("redirect_uri", "https://app.example.com/main/x"),
                        ("state", "s"), ("client_id", world.app.client_id)):
        query = urllib.parse.urlencode({name: value})
        status, headers, body = await post_authorize(api, f"/v1/oauth/authorize?{query}",
                                                     urllib.parse.urlencode({**form, name: value}))
        assert status == 400 and "Location" not in headers, (name, body)
        assert body["error"] == "invalid_request" and name in body["message"], body
    status, _, body = await post_authorize(api, body=urllib.parse.urlencode(form) + "&state=a&state=b")
    assert status == 400 and "repeated" in body["message"], body
    # the parameters split between the query and the body (none in both) work, and the launch was kept
    query = urllib.parse.urlencode({"client_id": world.app.client_id, "state": "split"})
    rest = {k: v for k, v in form.items() if k != "client_id"}
    status, headers, body = await post_authorize(api, f"/v1/oauth/authorize?{query}", urllib.parse.urlencode(rest))
    assert status == 303 and "code" in location_query(headers) and location_query(headers)["state"] == "split", body


def multipart(fields: dict) -> str:
    parts = [f'--x\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n' for k, v in fields.items()]
    return "".join(parts) + "--x--\r\n"


@pytest.mark.gen_test
async def test_a_post_body_that_is_not_a_form_is_refused(flow, world, api):
    launch_id = await flow.launch()
    form = urllib.parse.urlencode(form_of(world, launch_id))
    for content_type, body in (("application/json", json.dumps(form_of(world, launch_id))),
                               ("text/plain", form), ("multipart/form-data; boundary=x", multipart(form_of(world, launch_id))),
                               ("", form)):
        status, headers, answer = await api.call("POST", "/v1/oauth/authorize", body=body,
                                                 headers={"Content-Type": content_type})
        assert status == 415 and "Location" not in headers, (content_type, answer)
        assert answer["error"] == "invalid_request" and "application/x-www-form-urlencoded" in answer["message"]
    status, headers, _ = await post_authorize(api, body=form)  # the launch was not spent
    assert status == 303 and "code" in location_query(headers)


@pytest.mark.gen_test
async def test_a_post_body_too_large_nul_or_not_utf8_is_a_clear_4xx(flow, world, api, runtime):
    launch_id = await flow.launch()
    form = urllib.parse.urlencode(form_of(world, launch_id))
    status, _, body = await post_authorize(api, body=form + "&pad=" + "a" * runtime.settings.max_body_bytes)
    assert status == 413, body
    for bad in ("&state=a%00b", "&state=%FF", "&x%00=1", "&nonce=%C3%28"):
        status, headers, body = await post_authorize(api, body=form + bad)
        assert status == 400 and "Location" not in headers, (bad, body)
        assert body["error"] == "invalid_request", body
    status, _, body = await post_authorize(api, body=form.encode() + b"&state=\xff")
    assert status == 400 and "UTF-8" in body["message"], body
    status, headers, _ = await post_authorize(api, body=form)  # the launch was not spent
    assert status == 303 and "code" in location_query(headers)
