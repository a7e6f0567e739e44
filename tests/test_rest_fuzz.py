"""Property-based run (schemathesis) of every documented operation against a live `svc-auth serve`:
no 5xx, and every response conforms to `GET /v1/openapi.json` (status, content type, headers, body)."""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (content_type_conformance, not_a_server_error, response_headers_conformance,
                                 response_schema_conformance, status_code_conformance)

from helpers.environment import ROOT
from helpers.processes import free_port, start_process, stop_process
from partner_api.openapi import openapi_document
from ratelimit import DEFAULT_LIMITS

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]


def _cli(env, *args) -> dict:
    out = subprocess.run([sys.executable, "-m", "cli.__main__", *args, "--json"], env=env, cwd=str(ROOT),
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def live_service(tmp_path_factory):
    """A real server on SQLite with one installed app; limits raised so the run explores, not 429s."""
    import os
    tmp = tmp_path_factory.mktemp("fuzz")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SVC_")}
    env.update(SVC_DATABASE_URL=f"sqlite:///{tmp / 'svc.db'}", SVC_VAR_DIR=str(tmp / "var"), SVC_HMAC_KEY="f" * 32,
               SVC_ISSUER=f"http://127.0.0.1:{port}",
               SVC_RATE_LIMITS=",".join(f"{op}=100000/60" for op in DEFAULT_LIMITS))
    org = _cli(env, "orgs", "create", "--name", "Fuzz Clinic")
    app = _cli(env, "apps", "create", "--name", "Fuzz App", "--redirect-uri", "https://fuzz.example/app",
               "--launch-url", "https://fuzz.example/launch")
    _cli(env, "installs", "create", "--app", app["application_id"], "--org", org["id"])
    proc = start_process(["serve", "--port", str(port)], env, port, log_path=tmp / "serve.log")
    try:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/oauth/token", headers={"Content-Type": "application/json"},
            data=json.dumps({"grant_type": "client_credentials", "client_id": app["client_id"],
                             "client_secret": app["client_secret"]}).encode())
        with urllib.request.urlopen(request, timeout=10) as response:
            token = json.loads(response.read())["access_token"]
        yield {"base_url": f"http://127.0.0.1:{port}", "token": token}
    finally:
        stop_process(proc)


SCHEMA = schemathesis.openapi.from_dict(openapi_document("http://127.0.0.1"))
OPERATIONS = {op.label: op for op in (result.ok() for result in SCHEMA.get_all_operations())}


@pytest.mark.slow
@pytest.mark.parametrize("label", sorted(OPERATIONS))
def test_no_server_errors_and_responses_match_openapi(label, live_service):
    operation = OPERATIONS[label]
    headers = {"Authorization": f"Bearer {live_service['token']}"}
    if "/oauth/" in operation.path or "/sandbox/" in operation.path:
        headers = None  # their own schemes; unauthenticated calls must still be clean 4xx

    @given(case=operation.as_strategy())
    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(case):
        case.call_and_validate(base_url=live_service["base_url"], headers=headers, checks=CHECKS,
                               allow_redirects=False)

    run()


# --- every route, every path parameter: bad input is a 4xx before the audit or the database ----
# (issue 36 item 5: on PostgreSQL `GET /v1/appointments/{300 digits}` answered 503 audit_unavailable,
# the failure record's 64-wide column refusing the id, where SQLite answered 400.)
BAD_SEGMENTS = ["1" * 300, "x" * 65, "a%00b", "%252e%252e", "a%252Fb", "%25", "a%0Ab", "%F0%9F%92%A9" * 20,
                "%2e%2e"]


def _route_paths(app, world) -> list[tuple[str, str]]:
    """(route pattern, path) with one capture group set to a bad segment, for every route and group;
    the other groups hold the caller's own ids (an application id after `applications/` or `apps/`)."""
    import re
    cases = []
    for rule in app.wildcard_router.rules:
        pattern = rule.matcher.regex.pattern.rstrip("$")
        groups = re.findall(r"\((?!\?)[^)]*\)[+*]?", pattern)
        for bad_at in range(len(groups)):
            for bad in BAD_SEGMENTS:
                path, rest, n = "", pattern, 0
                for group in groups:
                    before, rest = rest.split(group, 1)
                    path += before
                    if n == bad_at:
                        path += ("P" + "a" * 300) if group.startswith("([A-Z]") and bad == "1" * 300 else bad
                    elif group.startswith("([A-Z]"):
                        path += "Patient"
                    else:
                        path += world.app.id if path.endswith(("applications/", "apps/")) else world.org.id
                    n += 1
                path += rest
                cases.append((pattern, path.replace("\\.", ".").replace("\\", "")))
    return cases


@pytest.mark.gen_test(timeout=600)
async def test_bad_path_segments_are_a_4xx_on_every_route_and_both_databases(api, app, world, runtime,
                                                                             http_client, base_url):
    """Every route (partner API, FHIR API, chart URLs, sandbox, console, static), each path segment
    in turn over-long, with a NUL or a newline, percent-encoded twice, or `..`: GET and POST answer a
    4xx (a browser route without a session: its sign-in), never a 5xx, on SQLite and PostgreSQL."""
    import urllib.parse
    from console.accounts import invite_developer
    from helpers.console import ConsoleClient
    from helpers.tokens import mint_platform_token
    from helpers.rest import partner_headers
    partner = await partner_headers(api, world.app, world.secret)
    fhir = {"Authorization": "Bearer " + mint_platform_token(runtime, None, world.physician, world.app, world.org)}
    console = ConsoleClient(http_client, base_url)  # a developer signed in to the console: its pages too
    invite = urllib.parse.urlsplit(invite_developer(runtime, world.app.id, "fuzz@partner.example")[1]).path
    password = "correct horse battery staple"
    assert (await console.get(invite)).code == 200
    assert (await console.post(invite, {"password": password, "confirm": password})).code == 303
    assert (await console.sign_in("fuzz@partner.example", password)).code == 303
    failures = []
    for pattern, path in _route_paths(app, world):
        headers = fhir if pattern.startswith("/fhir") else partner
        for method in ("GET", "POST"):
            response = await api.http.fetch(api.base_url + path, method=method, raise_error=False,
                                            body=b"{}" if method == "POST" else None, follow_redirects=False,
                                            headers={**headers, "Content-Type": "application/json"})
            signin = response.code in (302, 303) and (response.headers.get("Location") or "").startswith("/console/login")
            if not (400 <= response.code < 500 or signin):  # a browser route without a session: to sign-in
                failures.append((method, path[:100], response.code, response.body[:200]))
        if pattern.startswith("/console/"):
            response = await console.get(path)
            if not 400 <= response.code < 500:
                failures.append(("GET (signed in)", path[:100], response.code, response.body[:200]))
    assert not failures, "\n".join(map(str, failures))
