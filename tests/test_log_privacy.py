"""What a reader of svc-auth's own log may see: a real `svc-auth serve` process, real requests, its
log file read back. Nobody who reads the logs may learn patient data or a credential from them."""
from __future__ import annotations

import json

from helpers.fhir_api import Fhir
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
