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
