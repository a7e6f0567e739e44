"""`svc-auth ehr check`: discovery, the token, a Practitioner search and an Appointment search, a
verdict per step."""
from __future__ import annotations

import datetime as dt

from connectors.base import ConnectorError
from connectors.fhir.query import NPI_SYSTEM, instant


def check(connector, npi: str | None, now: dt.datetime) -> list[dict]:
    """`svc-auth ehr check`: discovery, the token, one Practitioner search (by `npi` when given)
    and one Appointment search; a verdict per step, stopping at the first failure."""
    steps = []

    def step(name: str, action):
        try:
            steps.append({"step": name, "ok": True, "detail": action()})
        except (ConnectorError, LookupError) as exc:
            steps.append({"step": name, "ok": False, "detail": str(exc)})
        return steps[-1]["ok"]

    client, found = connector.client, {}
    open_server = client.auth == "none"
    if not step("discovery", lambda: "not used: an open server (--fhir-auth none)" if open_server
                else f"token endpoint {client.token_endpoint()}"):
        return steps
    if not step("token", lambda: "not used: an open server" if open_server
                else f"access token granted to {client.client_id}" if client.access_token() else "no token"):
        return steps

    def practitioner():
        params = {"identifier": f"{NPI_SYSTEM}|{npi}"} if npi else {"_count": 1}
        entries = connector.client.search("Practitioner", params).get("entry") or ()
        found["id"] = next((e["resource"]["id"] for e in entries), None)
        if npi and found["id"] is None:
            raise ConnectorError(f"no Practitioner has NPI {npi}")
        return f"Practitioner/{found['id']}" if found["id"] else "the search answered (no practitioners)"
    if not step("practitioner", practitioner):
        return steps

    def appointments():
        params = {"date": f"ge{instant(now)}", "_count": 1}
        if found.get("id"):
            params["practitioner"] = f"Practitioner/{found['id']}"
        bundle = connector.client.search("Appointment", params)
        return f"the search answered ({bundle.get('total', len(bundle.get('entry') or ()))} from now on)"
    step("appointments", appointments)
    return steps
