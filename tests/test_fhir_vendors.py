"""Clinics on EHRs that behave as their vendors document (tests/js/vendors.mjs: Oracle Health
Millennium, Epic, athenahealth), each connected with its profile: the night (`snapshot run`),
a chart and `ehr check` against each, and a hostile EHR's values (issue 28 item 4) skipped,
counted and named without breaking the night or the hub."""
from __future__ import annotations

import datetime as dt
import json
import urllib.request

import pytest
from helpers.fhir_ehr import (CLIENT_ID, appointment, chart_record, cli, connect_clinic, patient, practitioner,
                              start_fhir_ehr)

from connectors import ResourceQuery, connector_for
from lifecycle.applications import install_application
from hub.view import upcoming_appointments
from lifecycle.users import create_user
from lifecycle.verification import record_platform_verification
from models.directory import Organization, User
from workers.chart_archive import write_chart_json
from workers.snapshot import night_window

pytestmark = pytest.mark.slow
PRACTICE = "Organization/a-1.Practice-195900"   # the test EHR's athena practice (FHIR_EHR_PRACTICE)


def _ehr(vendor: str):
    ehr = start_fhir_ehr("--vendor", vendor)
    yield ehr
    ehr.proc.terminate()
    ehr.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def oracle_ehr():
    yield from _ehr("oracle")


@pytest.fixture(scope="module")
def epic_ehr():
    yield from _ehr("epic")


@pytest.fixture(scope="module")
def athena_ehr():
    yield from _ehr("athena")


def clinic_night(runtime, world, ehr, live, *flags: str):
    """A clinic on `ehr` (connected with `flags`), a physician in the hub the night's afternoon and a
    second whose NPI the EHR lacks; the night, its window's start and the physician."""
    settings = runtime.settings
    org_id = connect_clinic(settings, ehr, f"{live}/ehr/jwks.json", "Vendor Clinic", *flags)
    install_application(world.app.id, org_id)
    ana = create_user(org_id, "ana@vendor.example", "Ana", "Lopez", "alopez", "1417000001")
    create_user(org_id, "zed@vendor.example", "Zed", "Unknown", "zunknown", "1417000993")
    night = runtime.clock.now().date() + dt.timedelta(days=30)
    start, _ = night_window(settings, night)
    runtime.clock.offset = 0.0
    runtime.clock.advance((start - dt.timedelta(hours=10) - runtime.clock.now()).total_seconds())
    record_platform_verification(runtime, world.app, ana)
    return org_id, night, start, ana


def schedule(ana, start) -> list[dict]:
    day = dt.timedelta(days=1)
    return [practitioner("pr-ana", ana.npi, "Lopez", "Ana"), practitioner("pr-x", "1417000035", "Other", "Xavier"),
            patient("pt-1", "Doe", "Jane", "1970-01-02", "female"), patient("pt-2", "Roe", "Rick", "1955-06-30", "male"),
            appointment("a-booked", "pr-ana", "pt-1", start + day + dt.timedelta(hours=12)),
            appointment("a-arrived", "pr-ana", "pt-2", start + 2 * day, status="arrived"),
            appointment("a-proposed", "pr-ana", "pt-2", start + 3 * day, status="proposed"),
            appointment("a-cancelled", "pr-ana", "pt-1", start + 3 * day, status="cancelled"),
            appointment("x-booked", "pr-x", "pt-1", start + 2 * day)]


def night_of(settings, night) -> tuple[int, dict]:
    done = cli(settings, "snapshot", "run", "--date", night.isoformat(), "--json")
    return done.returncode, {**json.loads(done.stdout), "stderr": done.stderr}


def snapshot_ids(org_id: str) -> list[str]:
    from models.appointments import Snapshot, SnapshotAppointment
    snapshot = Snapshot.latest_complete(org_id)
    return sorted(a.ehr_appointment_id for a in SnapshotAppointment.select().where(SnapshotAppointment.snapshot == snapshot))


def ehr_check(settings, org_id: str, *flags: str) -> tuple[int, dict]:
    done = cli(settings, "ehr", "check", "--org", org_id, *flags, "--json")
    return done.returncode, json.loads(done.stdout)


def chart_json(runtime, org_id: str, patient_id: str, tmp_path) -> dict:
    """The chart ZIP's JSON for this patient, as the chart worker writes it."""
    chart = connector_for(runtime, Organization.get_by_id(org_id)).fetch_chart(patient_id)
    path = tmp_path / "chart.json"
    write_chart_json(chart, "req_test", str(path))
    return json.loads(path.read_text())


def test_oracle_millennium_no_include_proposed_via_date_or_req_period_v1_scopes_and_id_alone(
        runtime, world, live, oracle_ehr, tmp_path):
    settings = runtime.settings
    org_id, night, start, ana = clinic_night(runtime, world, oracle_ehr, live, "--fhir-profile", "oracle")
    oracle_ehr.seed(*schedule(ana, start), patient("pt-7", "Doe", "Jane", "1970-01-02", "female"),
                    *chart_record("pt-7", encounters=3, observations=2, documents=1))

    code, report = night_of(settings, night)
    assert code == 0 and org_id in report["built"], report
    # Patients read by _id (no _include on Millennium), proposed through -date-or-req-period.
    assert snapshot_ids(org_id) == ["a-arrived", "a-booked", "a-proposed"]
    assert report["skipped"] == {}
    assert oracle_ehr.stats()["pages"]["Patient"] >= 1

    code, verdict = ehr_check(settings, org_id)
    assert code == 0 and verdict["ok"], verdict
    token = next(s for s in verdict["steps"] if s["step"] == "token")
    assert "system/Appointment.read" in token["detail"]          # v1 scopes, discovered
    found = next(s for s in verdict["steps"] if s["step"] == "practitioner")
    assert found["npis"] == {"known": {"1417000001": "Practitioner/pr-ana"}, "unknown": ["1417000993"]}
    code, verdict = ehr_check(settings, org_id, "--npi", "1417000993")
    assert code == 1 and "1417000993" in verdict["steps"][-1]["detail"] and verdict["steps"][-1]["step"] == "practitioner"

    chart = chart_json(runtime, org_id, "pt-7", tmp_path)
    assert chart["omitted"] == [] and len(chart["encounters"]) == 3 and len(chart["observations"]) == 4
    # The platform API's search by id: `_id` alone, as Millennium requires (no `_count`).
    found = connector_for(runtime, Organization.get_by_id(org_id)).search_resources(ResourceQuery("Patient", ids=("pt-7",)))
    assert [r["id"] for r in found] == ["pt-7"]

    # Millennium takes an uploaded key set (System Account Management): the CLI prints ours.
    printed = json.loads(cli(settings, "ehr", "jwks").stdout)
    with urllib.request.urlopen(f"{live}/ehr/jwks.json", timeout=30) as served:
        assert printed == json.loads(served.read()) and all("d" not in k for k in printed["keys"])

    # Asking v2 scopes of a v1-only EHR: a token with no scope, every read refused, said so.
    assert cli(settings, "orgs", "update", "--org", org_id, "--fhir-scopes", "v2").returncode == 0
    code, verdict = ehr_check(settings, org_id)
    # (its token response names no scope: RFC 6749 5.1 reads that as the scopes asked, so the EHR's 403 says it,
    # to the operator of `ehr check` alone: the detail names the status and the issue code)
    assert code == 1 and "HTTP 403: OperationOutcome issue forbidden" in verdict["steps"][-1]["detail"], verdict
    assert "system/Practitioner.read" in verdict["steps"][-1]["ehr_said"], verdict


def test_epic_observations_by_category_and_no_schedule_search(runtime, world, live, epic_ehr, tmp_path):
    settings = runtime.settings
    org_id, night, start, ana = clinic_night(runtime, world, epic_ehr, live, "--fhir-profile", "epic")
    epic_ehr.seed(*schedule(ana, start), patient("pt-7", "Doe", "Jane", "1970-01-02", "female"),
                  *chart_record("pt-7", encounters=2, observations=3, documents=1))

    # Epic documents no FHIR R4 search of a provider's schedule: the night fails, naming its answer
    # (the status and the issue code; Epic's own words only in `ehr check`'s `ehr_said`).
    code, report = night_of(settings, night)
    assert code == 1, report
    failure = report["organizations"][org_id]
    assert failure.startswith("failed: ") and "HTTP 400" in failure and "issue not-supported" in failure, failure
    assert "Epic documents no FHIR R4 search" in failure and "practitioner search parameter" not in failure
    code, verdict = ehr_check(settings, org_id)
    assert code == 1 and [s["step"] for s in verdict["steps"]] == ["discovery", "token", "scopes", "practitioner", "appointments"]
    assert verdict["steps"][3]["ok"] and not verdict["steps"][4]["ok"]
    assert "not-supported" in verdict["steps"][4]["detail"]
    assert "practitioner search parameter is not supported" in verdict["steps"][4]["ehr_said"], verdict

    # Observations one search per category: the whole chart, nothing omitted.
    chart = chart_json(runtime, org_id, "pt-7", tmp_path)
    assert chart["omitted"] == []
    assert sorted(o["id"] for o in chart["observations"]) == ["obs-0000", "obs-0001", "obs-0002", "obs-a1c", "obs-bp"]
    assert epic_ehr.stats()["pages"]["Observation"] >= 2

    # Without the profile the Observation search is refused: left out and named, the rest charted.
    assert cli(settings, "orgs", "update", "--org", org_id, "--fhir-profile", "generic").returncode == 0
    chart = chart_json(runtime, org_id, "pt-7", tmp_path)
    assert [o["resourceType"] for o in chart["omitted"]] == ["Observation"]
    reason = chart["omitted"][0]["reason"]
    assert "the EHR refused the search of Observation" in reason and "HTTP 400" in reason, reason
    assert "category or code parameter is required" not in reason   # the EHR's own words: not in a chart
    assert chart["observations"] == [] and len(chart["encounters"]) == 2 and len(chart["problems"]) == 2


def test_athena_practice_parameter_on_every_search_and_its_error_body(runtime, world, live, athena_ehr, tmp_path):
    settings = runtime.settings
    missing = cli(settings, "orgs", "create", "--name", "No practice", "--ehr", "fhir", "--fhir-base-url",
                  athena_ehr.base, "--fhir-client-id", CLIENT_ID, "--fhir-profile", "athena")
    assert missing.returncode == 2 and "ah-practice" in missing.stderr
    for bad in ("ah-practice", "ah-practice=a&b=c", "_count=5", "patient=Patient/x", "Ah=1", "x=" + "y" * 300):
        refused = cli(settings, "orgs", "create", "--name", "Bad", "--ehr", "fhir", "--fhir-base-url", athena_ehr.base,
                      "--fhir-client-id", CLIENT_ID, "--fhir-search-param", bad)
        assert refused.returncode == 2 and "search" in refused.stderr.lower(), (bad, refused.stderr)
    org_id, night, start, ana = clinic_night(runtime, world, athena_ehr, live, "--fhir-profile", "athena",
                                             "--fhir-search-param", f"ah-practice={PRACTICE}")
    shown = json.loads(cli(settings, "orgs", "show", "--org", org_id, "--json").stdout)
    assert shown["fhir_profile"] == "athena" and shown["fhir_search_params"] == [f"ah-practice={PRACTICE}"]
    athena_ehr.seed(*schedule(ana, start), patient("pt-7", "Doe", "Jane", "1970-01-02", "female"),
                    *chart_record("pt-7", encounters=2, observations=1, documents=1))

    code, report = night_of(settings, night)
    assert code == 0 and org_id in report["built"], report
    assert snapshot_ids(org_id) == ["a-arrived", "a-booked", "a-proposed"]
    code, verdict = ehr_check(settings, org_id)
    assert code == 0 and verdict["ok"], verdict
    chart = chart_json(runtime, org_id, "pt-7", tmp_path)
    assert chart["omitted"] == [] and len(chart["observations"]) == 3 and len(chart["documents"]) == 1

    # Another practice's id: the night and its ERROR line name the refusal (HTTP 400, not an
    # OperationOutcome), never athena's own words, which may quote the search; `ehr check` shows
    # them to the operator (`ehr_said`), not "no details".
    assert cli(settings, "orgs", "update", "--org", org_id, "--fhir-search-param",
               "ah-practice=Organization/a-1.Practice-1").returncode == 0
    runtime.clock.advance(dt.timedelta(days=1).total_seconds())
    record_platform_verification(runtime, world.app, ana)      # in the hub the next night too
    code, report = night_of(settings, night + dt.timedelta(days=1))
    failure = report["organizations"][org_id]
    assert code == 1 and "HTTP 400" in failure and "no OperationOutcome" in failure, failure
    assert "Could not determine what practice" not in failure + report["stderr"], report
    code, verdict = ehr_check(settings, org_id)
    assert code == 1 and "HTTP 400" in verdict["steps"][-1]["detail"], verdict
    assert "Could not determine what practice" in verdict["steps"][-1]["ehr_said"], verdict


def test_hostile_values_are_skipped_counted_and_named_in_the_night_and_the_hub(runtime, world, live, oracle_ehr):
    """Issue 28 item 4: an unparseable start, an impossible birthDate and a bare-string participant;
    and birthDates FHIR allows that are not a day ("1980", "1980-05"), which a snapshot row cannot hold."""
    settings = runtime.settings
    org_id, night, start, ana = clinic_night(runtime, world, oracle_ehr, live, "--fhir-profile", "oracle")
    soon = start + dt.timedelta(days=1)
    oracle_ehr.seed(*schedule(ana, start), {**patient("pt-bad", "Bad", "Date", "1970-01-02", "other"),
                                            "birthDate": "2023-02-30"},
                    appointment("a-impossible-birth", "pr-ana", "pt-bad", soon + dt.timedelta(hours=2)),
                    {**patient("pt-year", "Year", "Only", "1970-01-02", "other"), "birthDate": "1980"},
                    appointment("a-birth-year", "pr-ana", "pt-year", soon + dt.timedelta(hours=3)),
                    {**patient("pt-month", "Month", "Only", "1970-01-02", "other"), "birthDate": "1980-05"},
                    appointment("a-birth-month", "pr-ana", "pt-month", soon + dt.timedelta(hours=4)))
    unparseable = {**appointment("a-unparseable", "pr-ana", "pt-1", soon), "start": "2026-12-26T99:00:00Z"}
    bare = appointment("a-bare-participant", "pr-ana", "pt-1", soon)
    bare["participant"] = [bare["participant"][0], "Patient/pt-1"]
    oracle_ehr.hostile(unparseable, bare)

    code, report = night_of(settings, night)
    assert code == 0 and org_id in report["built"], report
    assert snapshot_ids(org_id) == ["a-arrived", "a-booked", "a-proposed"]
    skipped = report["skipped"][org_id]
    partial = skipped.pop("patient's birthDate is not a whole day")  # in the EHR's order
    assert partial["count"] == 2 and sorted(partial["appointments"]) == ["a-birth-month", "a-birth-year"], partial
    assert skipped == {
        "impossible birthDate": {"count": 1, "appointments": ["a-impossible-birth"]},
        "malformed participant": {"count": 1, "appointments": ["a-bare-participant"]},
        "unparseable start": {"count": 1, "appointments": ["a-unparseable"]}}
    assert "5 appointments the EHR sent were left out" in report["stderr"]

    # The hub page's list of the physician's appointments survives the same answers.
    runtime.clock.advance((start - runtime.clock.now()).total_seconds())
    rows, error = upcoming_appointments(runtime, User.with_organization(ana.id))
    assert error is None and [r.patient_id for r in rows] == ["pt-1", "pt-2", "pt-2"]


def test_appointments_of_another_practitioner_or_outside_the_window_are_not_the_physicians(runtime, world, live,
                                                                                          oracle_ehr):
    """A FHIR server may ignore a search parameter it does not support and answer more than asked:
    the night listed whatever the appointment search of the physician's Practitioner answered, so
    another practitioner's appointment (a patient of a physician who never authorized the app)
    was in Ana's snapshot and hub, and one 20 days out was served as within the 10 days. An
    appointment is the physician's when a participant references their Practitioner (relative,
    absolute in the EHR's base, versioned) and it starts in the window; the others are left out."""
    settings = runtime.settings
    org_id, night, start, ana = clinic_night(runtime, world, oracle_ehr, live, "--fhir-profile", "oracle")
    oracle_ehr.seed(*schedule(ana, start))
    day = dt.timedelta(days=1)
    absolute = appointment("a-absolute", "pr-ana", "pt-1", start + day + dt.timedelta(hours=14))
    absolute["participant"][0]["actor"]["reference"] = f"{oracle_ehr.base}/Practitioner/pr-ana/_history/2"
    prefix = appointment("a-prefix", "pr-ana", "pt-1", start + day)
    prefix["participant"][0]["actor"]["reference"] = "Practitioner/pr-ana-2"
    bare = appointment("a-bare", "pr-ana", "pt-1", start + day)     # Ana's, though malformed: named, not dropped
    bare["participant"] = [p["actor"]["reference"] for p in bare["participant"]]
    oracle_ehr.hostile(appointment("x-other", "pr-x", "pt-2", start + day), prefix, absolute, bare,
                       appointment("a-late", "pr-ana", "pt-1", start + 20 * day),
                       appointment("a-before", "pr-ana", "pt-1", start - dt.timedelta(minutes=1)))
    try:
        code, report = night_of(settings, night)
        runtime.clock.advance((start - runtime.clock.now()).total_seconds())
        rows, error = upcoming_appointments(runtime, User.with_organization(ana.id))
    finally:
        oracle_ehr.hostile()
    assert code == 0 and report["organizations"][org_id] == 4, report
    assert snapshot_ids(org_id) == ["a-absolute", "a-arrived", "a-booked", "a-proposed"]
    assert report["skipped"][org_id] == {"malformed participant": {"count": 1, "appointments": ["a-bare"]}}
    assert "appointments of other practitioners or outside" in report["stderr"]
    assert error is None and [r.patient_id for r in rows] == ["pt-1", "pt-1", "pt-2", "pt-2"]


def test_an_appointment_the_ehr_pages_twice_is_listed_once(runtime, world, live, oracle_ehr):
    """An EHR that pages by offset shows an appointment on two pages when the schedule changes
    between them (one booked before the page already read): the night stored both copies, so the
    partner API listed that appointment twice and counted it twice in `total`, and the hub showed
    it twice. Each appointment is now listed once per physician."""
    settings = runtime.settings
    org_id, night, start, ana = clinic_night(runtime, world, oracle_ehr, live, "--fhir-profile", "oracle")
    oracle_ehr.seed(*schedule(ana, start))
    oracle_ehr.page_by(1)                     # one appointment a page: the copy and the original on two pages
    oracle_ehr.hostile(appointment("a-arrived", "pr-ana", "pt-2", start + dt.timedelta(days=2), status="arrived"))
    try:
        code, report = night_of(settings, night)
        runtime.clock.advance((start - runtime.clock.now()).total_seconds())
        rows, error = upcoming_appointments(runtime, User.with_organization(ana.id))
    finally:
        oracle_ehr.page_by(0)
        oracle_ehr.hostile()
    assert code == 0 and report["organizations"][org_id] == 3, report
    assert snapshot_ids(org_id) == ["a-arrived", "a-booked", "a-proposed"]
    assert error is None and [r.patient_id for r in rows] == ["pt-1", "pt-2", "pt-2"]


def test_an_appointment_id_that_is_no_fhir_id_is_skipped_not_a_failed_night(runtime, world, live, oracle_ehr):
    """An Appointment whose id is no FHIR id (65 characters, a NUL, a space), or whose `_include`d
    Patient's is not (65 characters), which no FHIR server stores: the snapshot's row refused it on
    PostgreSQL (its id columns hold 64 characters, and no text holds a NUL), so the whole clinic's
    night failed; on SQLite the API then listed an id no FHIR request can name. Each is skipped and
    counted (`invalid id`, `patient without a valid id`); the night is built."""
    settings = runtime.settings
    org_id, night, start, ana = clinic_night(runtime, world, oracle_ehr, live, "--fhir-profile", "oracle")
    oracle_ehr.seed(*schedule(ana, start))
    soon = start + dt.timedelta(days=1)
    long_patient = {**patient("pt-x", "Long", "Id", "1970-01-02", "other"), "id": "p" * 65}   # `_include`d
    oracle_ehr.hostile(*[{**appointment("a-x", "pr-ana", "pt-1", soon), "id": bad}
                         for bad in ("a" * 65, "a\u0000b", "a b")],
                       appointment("a-long-patient", "pr-ana", "p" * 65, soon), long_patient)
    code, report = night_of(settings, night)
    assert code == 0 and org_id in report["built"], report
    assert snapshot_ids(org_id) == ["a-arrived", "a-booked", "a-proposed"]
    assert report["skipped"][org_id]["invalid id"]["count"] == 3, report["skipped"]
    assert report["skipped"][org_id]["patient without a valid id"] == {"count": 1, "appointments": ["a-long-patient"]}


def test_migration_2651_gives_an_older_schema_the_profile_columns(runtime):
    """A database made before the vendor profiles gains them on migrate (existing clinics: generic, auto, none)."""
    import peewee
    from playhouse.migrate import PostgresqlMigrator, SqliteMigrator
    from playhouse.migrate import migrate as run

    from lifecycle.organizations import create_organization
    from models.appointments import Snapshot
    from models.schema import SchemaVersion
    db = runtime.db
    org = create_organization("Before profiles", "fhir", "https://ehr.example/fhir/R4", fhir_client_id="x")
    migrator = SqliteMigrator(db) if isinstance(db, peewee.SqliteDatabase) else PostgresqlMigrator(db)
    run(migrator.drop_column("organization", "fhir_profile"), migrator.drop_column("organization", "fhir_scopes"),
        migrator.drop_column("organization", "fhir_search_params"), migrator.drop_column("snapshot", "skipped"))
    SchemaVersion.delete().where(SchemaVersion.version.in_([2651, 2652])).execute()
    done = " ".join(runtime.migrate())
    assert "migration 2651" in done and "migration 2652" in done
    assert {"fhir_profile", "fhir_scopes", "fhir_search_params"} <= {c.name for c in db.get_columns("organization")}
    assert "skipped" in {c.name for c in db.get_columns(Snapshot._meta.table_name)}
    again = Organization.get_by_id(org.id)
    assert (again.fhir_profile, again.fhir_scopes, again.fhir_search_params) == ("generic", "auto", "[]")
