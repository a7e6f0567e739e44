"""What a reader of svc-auth's own log may see: a real `svc-auth serve` process, real requests, its
log file read back. Nobody who reads the logs may learn patient data or a credential from them."""
from __future__ import annotations

import json

import pytest

from helpers.fhir_api import Fhir, outcome
from helpers.fhir_ehr import connect_clinic, patient
from helpers.http import LiveHttp, basic_auth
from helpers.processes import wait_until
from helpers.tokens import mint_platform_token


def serve_log(tmp_path) -> str:
    return (tmp_path / "serve.log").read_text()


def test_a_fhir_search_s_patient_data_never_reaches_the_access_log(live, runtime, world, tmp_path):
    """A FHIR search names the patient it looks for (`Patient?family=…&birthdate=…`, an
    identifier, a phone) and what it looks for (`Condition?code=…`): PHI. The access line kept the
    query string whole, so anyone who reads the logs read the searches. Its values are left out
    (the parameter names and the paging controls stay)."""
    fhir = Fhir(live, world.org.id, mint_platform_token(runtime, live, world.physician, world.app, world.org.id))
    phi = {"family": "Zbigniewska", "given": "Hortensja", "birthdate": "1931-07-04",
           "identifier": "urn:oid:2.16.840.1.113883.4.1|078051120", "phone": "5550104477"}
    for name, value in phi.items():
        assert fhir.get("/Patient", {name: value, "_count": 5})[0] == 200
    assert fhir.get("/Condition", {"code": "http://snomed.info/sct|86406008", "patient": "p-1"})[0] in (200, 400, 403, 404)
    log = serve_log(tmp_path)
    for value in (*phi.values(), "Zbigniewska", "078051120", "86406008"):
        assert value not in log and value.replace("|", "%7C").replace(":", "%3A") not in log, value
    access = [json.loads(line) for line in log.splitlines()
              if line.startswith("{") and json.loads(line)["logger"] == "svc_auth.access"]
    searches = [line["path"] for line in access if line["route"].endswith("/([^/]+)") and "family=" in line["path"]]
    assert searches and "_count=5" in searches[0], searches


def test_at_debug_level_no_sql_statement_with_its_patient_data_is_logged(settings, world, runtime, tmp_path):
    """`SVC_LOG_LEVEL=DEBUG` (an operator chasing a problem) let the database layer log every SQL
    statement with its parameters: the disclosure record of a search (its query, its patients),
    snapshot and feed rows (names, dates of birth), stored hashes. svc-auth's own and the task
    queue's debug lines are written; the SQL and the S3 client's requests are not."""
    from helpers.processes import free_port, settings_env, start_process, stop_process
    port = free_port()
    issuer = f"http://127.0.0.1:{port}"
    env = settings_env(settings, SVC_ISSUER=issuer, SVC_PUBLIC_URL=issuer, SVC_LOG_LEVEL="DEBUG")
    proc = start_process(["serve", "--port", str(port)], env, port, log_path=tmp_path / "serve.log")
    try:
        fhir = Fhir(issuer, world.org.id, mint_platform_token(runtime, issuer, world.physician, world.app, world.org.id))
        assert fhir.get("/Patient", {"family": "Zbigniewska", "_count": 5})[0] == 200
    finally:
        stop_process(proc)
    lines = [json.loads(line) for line in serve_log(tmp_path).splitlines() if line.startswith("{")]
    assert any(line["level"] == "DEBUG" for line in lines)  # the level is honoured
    assert "Zbigniewska" not in serve_log(tmp_path)
    assert not [line for line in lines if line["logger"].split(".")[0] in ("peewee", "botocore", "urllib3")
                and line["level"] == "DEBUG"]


@pytest.mark.slow
def test_an_ehr_s_error_text_reaches_no_log_line_nor_a_chart_request_s_error(live, runtime, world, fhir_ehr, tmp_path):
    """A FHIR EHR's error quotes what it refused (Medplum: "Invalid format for date search
    parameter: ..."; others the whole search, or the patient's name): its OperationOutcome's text
    went, 300 characters of it, into the service's log line and into a chart request's stored and
    served `error`. Only the status, the issue code and the request's path are kept."""
    from lifecycle.activation import set_activation_status
    from lifecycle.applications import install_application
    from lifecycle.users import create_user
    from lifecycle.verification import record_platform_verification
    from models.charts import ChartRequest

    org_id = connect_clinic(runtime.settings, fhir_ehr, f"{live}/ehr/jwks.json", name="Log Privacy Clinic")
    fhir_ehr.seed(patient("pt-a", "Doe", "Jane", "1970-01-02", "female"))
    install_application(world.app.id, org_id)
    ana = create_user(org_id, "ana@log-privacy.example", "Ana", "Lopez", "alopez", "1417000043")
    set_activation_status(runtime, record_platform_verification(runtime, world.app, ana), "Enabled", world.app.id)
    fhir = Fhir(live, org_id, mint_platform_token(runtime, live, ana, world.app, org_id))
    assert fhir.ok("/Patient/pt-a")["id"] == "pt-a"       # discovery and the token: before the fault
    phi = ("Zbigniewska", "Hortensja", "078051120")
    fhir_ehr.fault(400, count=100, code="invalid",
                   text="Invalid search {request} (patient Hortensja Zbigniewska, MRN 078051120)")
    try:
        status, _, body = fhir.get("/Patient", {"family": "Zbigniewska", "given": "Hortensja", "_count": 5})
        assert status == 502 and outcome(body) == "exception", body
        assert not [value for value in phi if value in json.dumps(body)], body
        live_http = LiveHttp(live)
        status, _, token = live_http.call("POST", "/v1/oauth/token", form={"grant_type": "client_credentials"},
                                          headers={"Authorization": basic_auth(world.app.client_id, world.secret)})
        assert status == 200, token
        headers = {"Authorization": f"Bearer {token['access_token']}"}
        status, _, asked = live_http.call("POST", "/v1/chart-retrieval/requests",
                                          {"svc_organization_id": org_id, "patient_id": "pt-a"}, headers=headers)
        assert status == 202, asked
        wait_until(lambda: ChartRequest.get_by_id(asked["request_id"]).status != "pending", what="the chart's end")
        status, _, polled = live_http.call("GET", f"/v1/chart-retrieval/requests/{asked['request_id']}",
                                           headers=headers)
    finally:
        fhir_ehr.fault(400, count=0)
    assert status == 200 and polled["status"] == "failed" and "HTTP 400" in polled["error"], polled
    assert not [value for value in phi if value in polled["error"]], polled
    log = serve_log(tmp_path)
    refused = [json.loads(line) for line in log.splitlines() if line.startswith("{") and "HTTP 400" in line]
    assert refused and all("invalid" in line["message"] for line in refused), refused   # the status and the code
    assert not [value for value in phi if value in log], [line for line in log.splitlines() if "Hortensja" in line]
