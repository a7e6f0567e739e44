"""Bulk Data export under test: a clinic whose physician's schedule holds sandbox patients, and a
backend's HTTP client (kick-off, poll, download) as a partner writes one."""
from __future__ import annotations

import datetime as dt
import json
import time
import urllib.parse

from connectors.sandbox import patient_panel
from helpers.http import http
from models.application import Authorization
from models.appointments import Snapshot, SnapshotAppointment

KICKOFF_HEADERS = {"Accept": "application/fhir+json", "Prefer": "respond-async"}


def sync_window_closed_now() -> str:
    """SVC_SYNC_WINDOW opening 12 hours from now (UTC), for two hours: an embedded `serve`'s
    scheduler queues no night during the test, so its build never replaces the schedule
    `schedule_patients` wrote for today (the default 02:00-04:00 window did, at that hour)."""
    start = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=12)
    return f"{start:%H:%M}-{start + dt.timedelta(hours=2):%H:%M}"


def schedule_patients(org, physician, app, count: int, day: dt.date | None = None, first: int = 0) -> list[str]:
    """`physician` authorized `app`, and a complete snapshot of `org` with `count` of the sandbox
    panel's patients (from `first`) on the physician's schedule; their ids."""
    Authorization.get_or_create(application=app.id, user=physician.id)
    day = day or dt.date.today()
    snapshot = Snapshot.create(organization=org.id, snapshot_date=day, status="complete",
                               completed_at=dt.datetime.utcnow())
    patients = patient_panel(org.id)[first:first + count]
    for n, patient in enumerate(patients):
        start = dt.datetime.combine(day, dt.time(13, 0)) + dt.timedelta(minutes=30 * n)
        SnapshotAppointment.create(
            snapshot=snapshot, ehr_appointment_id=f"apt-{physician.id}-{day}-{n}", provider=physician.id,
            provider_npi=physician.npi, provider_name=physician.display_name, start=start,
            end=start + dt.timedelta(minutes=30), status="booked", appointment_type="Follow-up", reason="Check",
            location="Room 1", patient_id=patient.id, patient_first_name=patient.first_name,
            patient_last_name=patient.last_name, patient_date_of_birth=patient.date_of_birth, patient_sex=patient.sex)
    return [p.id for p in patients]


class BulkClient:
    """A partner's backend against one clinic's FHIR base with one access token."""

    def __init__(self, base: str, token: str | None):
        self.base, self.token = base.rstrip("/"), token

    def headers(self, extra: dict | None = None) -> dict:
        sent = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        sent.update(extra or {})
        return sent

    def request(self, method: str, url: str, body: bytes | None = None, headers: dict | None = None):
        url = url if url.startswith("http") else self.base + url
        status, response_headers, raw = http(method, url, body, self.headers(headers))
        return status, response_headers, raw

    def kick_off(self, path: str = "/Patient/$export", params=None, parameters: dict | None = None,
                 headers: dict | None = None):
        """(status, headers, JSON body) of a GET kick-off (`params`), or a POST one (`parameters`: a
        Parameters resource)."""
        url = self.base + path + (("?" + urllib.parse.urlencode(params)) if params else "")
        sent = dict(KICKOFF_HEADERS if headers is None else headers)
        if parameters is not None:
            sent.setdefault("Content-Type", "application/fhir+json")
            status, response_headers, raw = self.request("POST", url, json.dumps(parameters).encode(), sent)
        else:
            status, response_headers, raw = self.request("GET", url, None, sent)
        return status, response_headers, json.loads(raw) if raw else None

    def status(self, url: str):
        status, headers, raw = self.request("GET", url)
        return status, headers, json.loads(raw) if raw else None

    def wait(self, url: str, timeout: float = 120.0) -> dict:
        """Poll as the specification says (honouring Retry-After, capped at 1 s here) until the manifest."""
        deadline = time.monotonic() + timeout
        while True:
            status, headers, body = self.status(url)
            if status == 200:
                assert headers["Content-Type"].startswith("application/json"), headers["Content-Type"]
                return body
            assert status == 202, (status, body)
            assert headers["X-Progress"] and int(headers["Retry-After"]) >= 1
            assert time.monotonic() < deadline, f"export not done in {timeout}s: {headers['X-Progress']}"
            time.sleep(min(1.0, int(headers["Retry-After"])) / 4)

    def download(self, url: str) -> list[dict]:
        status, headers, raw = self.request("GET", url)
        assert status == 200, (status, raw[:300])
        assert headers["Content-Type"].startswith("application/fhir+ndjson"), headers["Content-Type"]
        text = raw.decode()
        assert text.endswith("\n")
        return [json.loads(line) for line in text.splitlines()]


class Backend:
    """A partner's backend app as SMART Backend Services has it: a key pair whose public JWKS is
    registered (`apps create --jwks-file`'s domain call), `system/*.rs` registered, installed in
    `org` and Enabled by the partner over the partner API; `token()` signs an assertion and asks
    `live`'s token endpoint for a system token, over HTTP."""

    def __init__(self, runtime, live: str, org, scopes: str = "system/*.rs", name: str = "Population Health"):
        from helpers.backend import KeyPair, jwks
        from lifecycle.applications import install_application, register_application
        from lifecycle.backend_apps import set_backend_keys, set_system_scopes
        self.live, self.pair = live, KeyPair("ES384")
        app, self.secret = register_application(runtime, name, "https://analytics.example/cb",
                                                "https://analytics.example/launch")
        set_backend_keys(runtime, app.id, jwks_text=json.dumps(jwks(self.pair)))
        self.app = set_system_scopes(runtime, app.id, scopes)
        install_application(self.app.id, org.id)
        self.enable(org.id)

    def enable(self, organization_id: str) -> None:
        status, _, raw = http("POST", f"{self.live}/v1/oauth/token", json.dumps({
            "grant_type": "client_credentials", "client_id": self.app.client_id,
            "client_secret": self.secret}).encode(), {"Content-Type": "application/json"})
        assert status == 200, raw
        partner = json.loads(raw)["access_token"]
        status, _, raw = http("PUT", f"{self.live}/v1/applications/{self.app.id}/organizations/{organization_id}"
                                     "/activation-status", json.dumps({"status": "Enabled"}).encode(),
                              {"Content-Type": "application/json", "Authorization": f"Bearer {partner}"})
        assert status == 200, raw

    def token(self, scope: str = "system/*.rs") -> str:
        from helpers.backend import assertion, token_form
        signed = assertion(self.pair, self.app.client_id, f"{self.live}/v1/oauth/token")
        status, _, raw = http("POST", f"{self.live}/v1/oauth/token",
                              urllib.parse.urlencode(token_form(signed, scope)).encode(),
                              {"Content-Type": "application/x-www-form-urlencoded"})
        assert status == 200, raw
        return json.loads(raw)["access_token"]

    def client(self, organization_id: str, scope: str = "system/*.rs") -> BulkClient:
        return BulkClient(f"{self.live}/fhir/r4/{organization_id}", self.token(scope))
