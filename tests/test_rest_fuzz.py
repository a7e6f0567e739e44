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

from helpers import ROOT, free_port, start_process, stop_process
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
