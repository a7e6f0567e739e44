"""An Epic clinic's night from Epic's GetProviderAppointments web service (issue 47 item 4; CONTRACTS.md
"Epic clinics' schedules"), against the test EHR's `epic` vendor switch (tests/js/epic_scheduling.mjs:
the web service answering from the FHIR resources seeded in Medplum), with real `snapshot run`,
`serve` and REST API calls: statuses mapped, local times in the clinic's time zone, the window, the NPI
filter, the pages, a chart of a patient the night listed, a refusal that keeps the previous snapshot,
and, without `--epic-user-id`, the night that names both ways out."""
from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import zoneinfo

import pytest

from helpers.charts import fetch_zip, open_archive, wait_until_not_pending
from helpers.environment import ROOT
from helpers.hub import hub_page_at
from helpers.fhir_ehr import appointment, chart_record, cli, connect_clinic, patient, practitioner, start_fhir_ehr
from helpers.processes import settings_env
from helpers.rest import partner_headers
from lifecycle.activation import set_activation_status
from lifecycle.applications import install_application
from lifecycle.users import create_user
from lifecycle.verification import record_platform_verification
from models.appointments import Snapshot, SnapshotAppointment
from models.disclosures import DisclosureRecord
from workers.snapshot import COVERAGE, night_window

pytestmark = pytest.mark.slow
ZONE = "America/Chicago"
PATIENT_SYSTEM = "urn:oid:1.2.840.114350.1.13.0.1.7.5.737384.0"   # where the clinic's Patients hold Epic's Internal id
EXTERNAL = {"text": "EXTERNAL"}
SER_SYSTEM = "urn:oid:1.2.840.114350.1.13.0.1.7.5.737384.7"


@pytest.fixture(scope="module")
def epic_web_ehr():
    ehr = start_fhir_ehr("--vendor", "epic")
    yield ehr
    ehr.proc.terminate()
    ehr.proc.wait(timeout=10)


def epic_practitioner(pid: str, npi: str, family: str, given: str, external: str) -> dict:
    found = practitioner(pid, npi, family, given)
    found["identifier"].append({"system": SER_SYSTEM, "type": EXTERNAL, "value": external})
    return found


def epic_patient(pid: str, family: str, given: str, birth: str, gender: str, internal: str | None) -> dict:
    found = patient(pid, family, given, birth, gender)
    if internal:
        found["identifier"].append({"system": PATIENT_SYSTEM, "type": {"text": "EPI"}, "value": internal})
    return found


def night_of(settings, night) -> tuple[int, dict]:
    done = cli(settings, "snapshot", "run", "--date", night.isoformat(), "--json")
    return done.returncode, {**json.loads(done.stdout), "stderr": done.stderr}


async def listed(api, headers, org_id: str) -> list[dict]:
    rows, offset, pages = [], 0, 0
    while True:
        status, _, body = await api.call("GET", f"/v1/appointments/{org_id}?offset={offset}&limit=50", headers=headers)
        assert status == 200, body
        rows, offset, pages = rows + body["appointments"], offset + 50, pages + 1
        if offset >= body["total"]:
            assert pages == -(-body["total"] // 50) and len(rows) == body["total"]
            return rows


def iso(moment: dt.datetime) -> str:
    return moment.replace(microsecond=0).isoformat() + "Z"


def epic_clinic(runtime, world, ehr, live, *flags: str):
    """An Epic clinic with the web service (`flags` more), its physicians Ana and Ben in the hub the
    night's afternoon, Cal authorized long ago (not in that night), Zed whose NPI the EHR lacks; the
    night and its window's start."""
    settings = runtime.settings
    org_id = connect_clinic(settings, ehr, f"{live}/ehr/jwks.json", "Epic Clinic", "--fhir-profile", "epic",
                            "--time-zone", ZONE, *flags)
    ehr.epic(time_zone=ZONE, patient_system=PATIENT_SYSTEM)
    install_application(world.app.id, org_id)
    users = [create_user(org_id, f"{name.lower()}@epic.example", name, family, name.lower(), npi) for name, family, npi in
             (("Ana", "Lopez", "1417000001"), ("Ben", "Okafor", "1417000019"), ("Cal", "Nguyen", "1417000027"),
              ("Zed", "Unknown", "1417000993"))]
    night = runtime.clock.now().date() + dt.timedelta(days=30)
    start, _ = night_window(settings, night)
    for user, when in ((users[2], start - dt.timedelta(days=20)), (users[0], start - dt.timedelta(hours=10)),
                       (users[1], start - dt.timedelta(hours=10)), (users[3], start - dt.timedelta(hours=10))):
        runtime.clock.offset = 0.0
        runtime.clock.advance((when - runtime.clock.now()).total_seconds())
        installation = record_platform_verification(runtime, world.app, user)
        if installation.activation_status != "Enabled":  # the first launch left it Disabled: the app enables itself
            set_activation_status(runtime, installation, "Enabled", world.app.id)
    return org_id, night, start, users


def seed_schedule(ehr, start: dt.datetime) -> None:
    day, hour = dt.timedelta(days=1), dt.timedelta(hours=1)
    ehr.seed(
        epic_practitioner("pr-ana", "1417000001", "Lopez", "Ana", "E-ANA-1"),
        epic_practitioner("pr-ben", "1417000019", "Okafor", "Ben", "E-BEN-2"),
        epic_practitioner("pr-cal", "1417000027", "Nguyen", "Cal", "E-CAL-3"),
        epic_practitioner("pr-x", "1417000035", "Other", "Xavier", "E-X-4"),
        epic_patient("pt-1", "Doe", "Jane", "1970-01-02", "female", "Z1001"),
        epic_patient("pt-2", "Roe", "Rick", "1955-06-30", "male", "Z1002"),
        epic_patient("pt-ghost", "Ghost", "Gail", "1980-05-05", "female", None),   # no Internal id: not found
        *chart_record("pt-1", encounters=2, observations=1, documents=1),
        appointment("ana-booked", "pr-ana", "pt-1", start + day + 12 * hour + dt.timedelta(minutes=15), minutes=45),
        appointment("ana-arrived", "pr-ana", "pt-2", start + 2 * day + 3 * hour, status="arrived"),
        appointment("ana-checked-in", "pr-ana", "pt-2", start + 2 * day + 4 * hour, status="checked-in"),
        appointment("ana-proposed", "pr-ana", "pt-1", start + 3 * day + 5 * hour, status="proposed"),
        appointment("ana-phoned", "pr-ana", "pt-1", start + 3 * day + 6 * hour),           # "Phoned Patient"
        appointment("ana-cancelled", "pr-ana", "pt-1", start + 4 * day, status="cancelled"),
        appointment("ana-hh", "pr-ana", "pt-1", start + 4 * day + hour),                   # "HH incomplete"
        appointment("ana-noshow", "pr-ana", "pt-2", start + 4 * day + 2 * hour, status="noshow"),
        appointment("ana-left", "pr-ana", "pt-2", start + 4 * day + 3 * hour),             # "Left without seen"
        appointment("ana-completed", "pr-ana", "pt-2", start + 4 * day + 4 * hour, status="fulfilled"),
        appointment("ana-bumped", "pr-ana", "pt-2", start + 5 * day),                      # "Bumped": unknown
        appointment("ana-ghost", "pr-ana", "pt-ghost", start + 5 * day + hour),            # patient not found
        appointment("ana-first", "pr-ana", "pt-1", start),                                  # the window's first minute
        appointment("ana-before", "pr-ana", "pt-1", start - dt.timedelta(minutes=1)),      # same local date, before
        appointment("ana-last", "pr-ana", "pt-1", start + COVERAGE - dt.timedelta(minutes=1)),
        appointment("ana-after", "pr-ana", "pt-1", start + COVERAGE),                       # same local date, after
        appointment("cal-booked", "pr-cal", "pt-1", start + 2 * day),                      # Cal: not in that night
        appointment("x-booked", "pr-x", "pt-1", start + 2 * day),                          # no user of the clinic
        # Ben: more than a page of the REST API (50)
        *[appointment(f"ben-{n:03d}", "pr-ben", f"pt-{1 + n % 2}", start + dt.timedelta(hours=8 + n * 2))
          for n in range(70)])
    ehr.epic(statuses={"ana-phoned": "Phoned Patient", "ana-hh": "HH incomplete", "ana-left": "Left without seen",
                       "ana-bumped": "Bumped"})


EXPECTED = sorted(["ana-booked", "ana-arrived", "ana-checked-in", "ana-proposed", "ana-phoned", "ana-first",
                   "ana-last", *[f"ben-{n:03d}" for n in range(70)]])


@pytest.mark.gen_test(timeout=600)
async def test_an_epic_clinics_night_comes_from_get_provider_appointments(api, runtime, world, live, epic_web_ehr):
    settings = runtime.settings
    org_id, night, start, (ana, ben, cal, zed) = epic_clinic(
        runtime, world, epic_web_ehr, live, "--epic-user-id", "SVCAUTH", "--epic-patient-id-system", PATIENT_SYSTEM)
    seed_schedule(epic_web_ehr, start)

    code, report = night_of(settings, night)
    assert code == 0 and org_id in report["built"], report
    assert report["skipped"][org_id] == {"unknown Epic status": {"count": 1, "appointments": ["ana-bumped"]},
                                         "patient not found in the EHR": {"count": 1, "appointments": ["ana-ghost"]}}

    # One call per physician of that night whose NPI the EHR knows, over the clinic's local dates.
    zone = zoneinfo.ZoneInfo(ZONE)
    first = start.replace(tzinfo=dt.timezone.utc).astimezone(zone).date()
    last = (start + COVERAGE - dt.timedelta(seconds=1)).replace(tzinfo=dt.timezone.utc).astimezone(zone).date()
    assert first == night - dt.timedelta(days=1)        # 02:00 UTC is the evening before in Chicago
    calls = epic_web_ehr.epic()["calls"]
    assert sorted(c["Providers"][0]["ID"] for c in calls) == ["E-ANA-1", "E-BEN-2"]
    for call in calls:
        assert call == {"UserID": "SVCAUTH", "UserIDType": "External", "StartDate": first.strftime("%m/%d/%Y"),
                        "EndDate": last.strftime("%m/%d/%Y"), "Providers": [{"ID": call["Providers"][0]["ID"],
                                                                              "IDType": "External"}],
                        "IncludeAllStatuses": "true"}

    done = cli(settings, "ehr", "check", "--org", org_id, "--json")
    verdict = json.loads(done.stdout)
    assert done.returncode == 0 and verdict["ok"], verdict
    assert "Epic's GetProviderAppointments answered for NPI 1417000001" in verdict["steps"][-1]["detail"]

    headers = await partner_headers(api, world.app, world.secret)
    rows = await listed(api, headers, org_id)
    assert sorted(r["id"] for r in rows) == EXPECTED
    by_id = {r["id"]: r for r in rows}
    booked = by_id["ana-booked"]
    began = start + dt.timedelta(days=1, hours=12, minutes=15)     # Chicago's wall time back to UTC
    assert (booked["start"], booked["end"]) == (iso(began), iso(began + dt.timedelta(minutes=45)))
    assert booked["status"] == "booked" and booked["appointment_type"] == "Follow-up"
    assert booked["location"] == "Main Street Clinic" and booked["provider"]["npi"] == ana.npi
    assert booked["patient"] == {"id": "pt-1", "first_name": "Jane", "last_name": "Doe",
                                 "date_of_birth": "1970-01-02", "sex": "female"}
    assert {k: by_id[k]["status"] for k in ("ana-arrived", "ana-checked-in", "ana-proposed", "ana-phoned")} == {
        "ana-arrived": "arrived", "ana-checked-in": "arrived", "ana-proposed": "proposed", "ana-phoned": "booked"}
    assert by_id["ana-first"]["start"] == iso(start) and by_id["ana-last"]["start"] == iso(start + COVERAGE
                                                                                           - dt.timedelta(minutes=1))
    assert by_id["ben-001"]["patient"]["id"] == "pt-2" and by_id["ben-001"]["provider"]["npi"] == ben.npi

    # Each request to the EHR is one ehr.fetch record; the web service's names the patients it listed.
    fetched = [r for r in DisclosureRecord.select().where((DisclosureRecord.organization_id == org_id)
                                                          & (DisclosureRecord.action == "ehr.fetch"))]
    service = [r for r in fetched if "service=GetProviderAppointments" in (r.query or "")]
    assert len(service) == 2 and all(r.outcome == "success" and r.resource_type == "Appointment" for r in service)
    assert {p for r in service for p in r.patients} == {"pt-1", "pt-2"}

    # A chart request for a patient the night listed reads that FHIR Patient.
    status, _, created = await api.call("POST", "/v1/chart-retrieval/requests",
                                        {"svc_organization_id": org_id, "patient_id": booked["patient"]["id"]},
                                        headers=headers)
    assert status == 202, created
    done = await wait_until_not_pending(api, headers, created["request_id"], timeout=120)
    assert done["status"] == "ready", done
    status, _, body = await api.call("GET", f"/v1/chart-retrieval/download-url/{created['request_id']}", headers=headers)
    _, chart = open_archive((await fetch_zip(api, body["download_url"], runtime)).body, created["request_id"],
                            world.app.id)
    assert chart["patient"]["id"] == "pt-1" and len(chart["encounters"]) == 2 and chart["omitted"] == []

    # Physicians named by NPI, patients by the answer's FHIR id (Gail's too, who has no Internal id
    # among her identifiers): the same night, no identifier search.
    assert cli(settings, "orgs", "update", "--org", org_id, "--epic-provider-id-type", "NPI",
               "--epic-patient-id-system", "").returncode == 0
    epic_web_ehr.epic(fhir_patient_ids=True)
    pages_before, calls_before = epic_web_ehr.stats()["pages"].get("Patient", 0), len(epic_web_ehr.epic()["calls"])
    code, report = night_of(settings, night)
    assert code == 0 and org_id in report["built"], report
    assert report["skipped"][org_id] == {"unknown Epic status": {"count": 1, "appointments": ["ana-bumped"]}}
    assert sorted(r["id"] for r in await listed(api, headers, org_id)) == sorted(EXPECTED + ["ana-ghost"])
    assert sorted(json.dumps(c["Providers"]) for c in epic_web_ehr.epic()["calls"][calls_before:]) == [
        json.dumps([{"ID": npi, "IDType": "NPI"}]) for npi in (ana.npi, ben.npi)]
    assert epic_web_ehr.stats()["pages"].get("Patient", 0) == pages_before   # Patients read by id, not searched


@pytest.mark.gen_test(timeout=600)
async def test_a_refusal_fails_the_night_and_keeps_the_previous_snapshot(api, runtime, world, live, epic_web_ehr):
    settings = runtime.settings
    org_id, night, start, (ana, ben, _, _) = epic_clinic(runtime, world, epic_web_ehr, live, "--epic-user-id",
                                                         "SVCAUTH", "--epic-patient-id-system", PATIENT_SYSTEM)
    seed_schedule(epic_web_ehr, start)
    code, report = night_of(settings, night)
    assert code == 0, report
    kept = Snapshot.latest_complete(org_id)
    headers = await partner_headers(api, world.app, world.secret)
    assert sorted(r["id"] for r in await listed(api, headers, org_id)) == EXPECTED

    tomorrow = night + dt.timedelta(days=1)     # Ana and Ben in the hub again the next afternoon
    runtime.clock.advance(dt.timedelta(days=1).total_seconds())
    for user in (ana, ben):
        record_platform_verification(runtime, world.app, user)
    headers = await partner_headers(api, world.app, world.secret)   # a day later: a new partner token
    for status, error in ((200, "Provider schedule access is not authorized for this user."),
                          (400, "Invalid provider ID type.")):
        epic_web_ehr.epic(error=error, error_status=status)
        code, report = night_of(settings, tomorrow)
        failure = report["organizations"][org_id]
        assert code == 1 and failure.startswith("failed: ") and error in failure and "GetProviderAppointments" in failure
        assert (f"HTTP {status}" in failure) == (status != 200), failure
        assert Snapshot.latest_complete(org_id).id == kept.id
        assert sorted(r["id"] for r in await listed(api, headers, org_id)) == EXPECTED
        done = cli(settings, "ehr", "check", "--org", org_id, "--json")
        step = json.loads(done.stdout)["steps"][-1]
        assert done.returncode == 1 and step["step"] == "appointments" and not step["ok"] and error in step["detail"]
    failed = DisclosureRecord.select().where((DisclosureRecord.organization_id == org_id)
                                             & (DisclosureRecord.action == "ehr.fetch")
                                             & (DisclosureRecord.outcome == "failure"))
    assert sum("service=GetProviderAppointments" in (r.query or "") for r in failed) >= 2

    # The Epic user that the web service does not know: refused the same way.
    epic_web_ehr.epic(error=None, user_id="SOMEONE-ELSE")
    code, report = night_of(settings, tomorrow)
    assert code == 1 and "User SVCAUTH of type External was not found" in report["organizations"][org_id]
    assert Snapshot.latest_complete(org_id).id == kept.id

    # An answer past the night's size bound (SVC_EHR_BATCH_MAX_BYTES) is not read further: the night
    # fails naming the bound and the web service's path.
    epic_web_ehr.epic(user_id="SVCAUTH")
    done = subprocess.run([sys.executable, "-m", "cli.__main__", "snapshot", "run", "--date", tomorrow.isoformat(),
                           "--json"], env=settings_env(settings, SVC_EHR_BATCH_MAX_BYTES="8000"), cwd=str(ROOT),
                          capture_output=True, text=True, timeout=180)
    failure = json.loads(done.stdout)["organizations"][org_id]
    assert done.returncode == 1 and "[bound: max_bytes]" in failure and "GetProviderAppointments" in failure, failure
    assert Snapshot.latest_complete(org_id).id == kept.id


def test_an_unreadable_duration_skips_that_appointment_only(runtime, world, live, epic_web_ehr):
    """`AppointmentDuration` "²" (str.isdigit says yes, int() refuses) or Arabic-Indic digits: that
    appointment is skipped as unreadable, named in the night's report; the night is built."""
    org_id, night, start, _ = epic_clinic(runtime, world, epic_web_ehr, live, "--epic-user-id", "SVCAUTH",
                                          "--epic-patient-id-system", PATIENT_SYSTEM)
    seed_schedule(epic_web_ehr, start)
    epic_web_ehr.epic(durations={"ana-booked": "\u00b2", "ben-007": "\u0661\u0662", "ben-008": " 25 "})
    code, report = night_of(runtime.settings, night)
    assert code == 0 and org_id in report["built"], report
    skipped = report["skipped"][org_id]
    durations = skipped.pop("unparseable duration", {})
    assert durations.get("count") == 2 and sorted(durations["appointments"]) == ["ana-booked", "ben-007"], report
    assert skipped == {"unknown Epic status": {"count": 1, "appointments": ["ana-bumped"]},
                       "patient not found in the EHR": {"count": 1, "appointments": ["ana-ghost"]}}
    snapshot = Snapshot.latest_complete(org_id)
    rows = {r.ehr_appointment_id: r
            for r in SnapshotAppointment.select().where(SnapshotAppointment.snapshot == snapshot.id)}
    assert sorted(rows) == sorted(set(EXPECTED) - {"ana-booked", "ben-007"})
    assert rows["ben-008"].end - rows["ben-008"].start == dt.timedelta(minutes=25)


def test_a_start_out_of_range_skips_that_appointment_only(runtime, world, live, epic_web_ehr):
    """A `Date` of 12/31/9999 whose evening in Chicago is past year 9999 in UTC (Python's datetime
    overflows; the whole `snapshot run` died of it): that appointment is skipped as an unparseable
    start, named in the night's report, as is a start time of 13:00 PM; the night is built."""
    org_id, night, start, _ = epic_clinic(runtime, world, epic_web_ehr, live, "--epic-user-id", "SVCAUTH",
                                          "--epic-patient-id-system", PATIENT_SYSTEM)
    seed_schedule(epic_web_ehr, start)
    epic_web_ehr.epic(overrides={"ana-booked": {"Date": "12/31/9999", "AppointmentStartTime": "11:30 PM"},
                                 "ben-007": {"AppointmentStartTime": "13:00 PM"}})
    code, report = night_of(runtime.settings, night)
    assert code == 0 and org_id in report["built"], report
    skipped = report["skipped"][org_id]
    starts = skipped.pop("unparseable start", {})
    assert starts.get("count") == 2 and sorted(starts["appointments"]) == ["ana-booked", "ben-007"], report
    snapshot = Snapshot.latest_complete(org_id)
    rows = {r.ehr_appointment_id for r in SnapshotAppointment.select().where(SnapshotAppointment.snapshot == snapshot.id)}
    assert sorted(rows) == sorted(set(EXPECTED) - {"ana-booked", "ben-007"})


def test_without_an_epic_user_the_night_names_both_ways_out(runtime, world, live, epic_web_ehr):
    settings = runtime.settings
    org_id, night, start, _ = epic_clinic(runtime, world, epic_web_ehr, live, "--epic-user-id", "SVCAUTH")
    assert json.loads(cli(settings, "orgs", "show", "--org", org_id, "--json").stdout)["epic_user_id"] == "SVCAUTH"
    shown = json.loads(cli(settings, "orgs", "update", "--org", org_id, "--epic-user-id", "", "--json").stdout)
    assert shown["epic_user_id"] is None and shown["time_zone"] == ZONE and shown["fhir_profile"] == "epic"
    seed_schedule(epic_web_ehr, start)
    code, report = night_of(settings, night)
    failure = report["organizations"][org_id]
    assert code == 1 and "Epic documents no FHIR R4 search of a practitioner's appointments" in failure
    assert "GetProviderAppointments" in failure and "--epic-user-id" in failure and "--schedule-source siu" in failure
    assert epic_web_ehr.epic()["calls"] == []
    assert Snapshot.latest_complete(org_id) is None


@pytest.mark.parametrize("flags, needle", [
    (("--epic-user-id", "SVCAUTH"), "--fhir-profile epic"),                                  # not an Epic clinic
    (("--fhir-profile", "epic", "--epic-provider-id-type", "SER"), "--epic-provider-id-type"),
    (("--fhir-profile", "epic", "--epic-patient-id-system", "not a uri"), "--epic-patient-id-system"),
    (("--fhir-profile", "epic", "--epic-user-id", "bad\tuser"), "--epic-user-id"),
])
def test_bad_epic_settings_exit_2_naming_them(runtime, flags, needle):
    done = cli(runtime.settings, "orgs", "create", "--name", "Bad Epic", "--ehr", "fhir", "--fhir-base-url",
               "https://epic.example/interconnect/api/FHIR/R4", "--fhir-client-id", "x", *flags)
    assert done.returncode == 2 and needle in done.stderr.strip().splitlines()[-1], done.stderr
    done = cli(runtime.settings, "orgs", "create", "--name", "Bad Epic", "--ehr", "fhir", "--fhir-base-url",
               "https://epic.example/fhir/R4", "--fhir-client-id", "x", "--fhir-profile", "epic", "--epic-user-id", "U")
    assert done.returncode == 2 and "/api/FHIR/R4" in done.stderr


def test_control_characters_in_epics_text_never_fail_the_night(runtime, world, live, epic_web_ehr):
    """A NUL (or other control character) in what Epic writes (`VisitTypeName`, `DepartmentName`)
    or in a Patient's name: PostgreSQL refuses NUL in text, so one such appointment failed the whole
    clinic's night, every night. The characters are dropped from the snapshot's text; the night is
    built with every appointment, as readable text."""
    org_id, night, start, _ = epic_clinic(runtime, world, epic_web_ehr, live, "--epic-user-id", "SVCAUTH",
                                          "--epic-patient-id-system", PATIENT_SYSTEM)
    seed_schedule(epic_web_ehr, start)
    epic_web_ehr.seed(epic_patient("pt-2", "Ro\u0000e", "Ri\u001bck", "1955-06-30", "male", "Z1002"))
    epic_web_ehr.epic(overrides={"ana-booked": {"VisitTypeName": "Follow\u0000-up\u0007"},
                                 "ben-007": {"Providers": [{"DepartmentName": "Main\u0000 Street\u0085Clinic"}]}})
    code, report = night_of(runtime.settings, night)
    assert code == 0 and org_id in report["built"], report
    snapshot = Snapshot.latest_complete(org_id)
    rows = {r.ehr_appointment_id: r
            for r in SnapshotAppointment.select().where(SnapshotAppointment.snapshot == snapshot.id)}
    assert sorted(rows) == EXPECTED
    assert rows["ana-booked"].appointment_type == "Follow-up"
    assert rows["ben-007"].location == "Main Street Clinic"
    assert (rows["ben-001"].patient_last_name, rows["ben-001"].patient_first_name) == ("Roe", "Rick")


def test_an_identifier_list_of_the_wrong_type_skips_that_physician_or_patient_only(runtime, world, live,
                                                                                   epic_web_ehr):
    """A Practitioner or Patient whose `identifier` is a number or `true`, not a list (no FHIR server
    stores one; a broken or hostile EHR may send it): iterating it raised TypeError, and the whole
    clinic's night failed as an unexpected error. Now that physician is counted as having no Epic
    provider id and that patient as not found; the night is built with everyone else."""
    org_id, night, start, _ = epic_clinic(runtime, world, epic_web_ehr, live, "--epic-user-id", "SVCAUTH",
                                          "--epic-patient-id-system", PATIENT_SYSTEM)
    seed_schedule(epic_web_ehr, start)
    epic_web_ehr.reshape({"Practitioner/pr-ana": {"identifier": 5}, "Patient/pt-2": {"identifier": True}})
    try:
        code, report = night_of(runtime.settings, night)
    finally:
        epic_web_ehr.reshape({})
    assert code == 0 and org_id in report["built"], report
    skipped = report["skipped"][org_id]
    assert skipped["physician without an Epic provider id (an identifier whose type.text is EXTERNAL)"] == {
        "count": 1, "appointments": ["NPI 1417000001"]}, skipped
    assert skipped["patient not found in the EHR"]["count"] == 35, skipped     # Ben's odd ones: pt-2's
    snapshot = Snapshot.latest_complete(org_id)
    rows = {r.ehr_appointment_id
            for r in SnapshotAppointment.select().where(SnapshotAppointment.snapshot == snapshot.id)}
    assert sorted(rows) == [f"ben-{n:03d}" for n in range(0, 70, 2)]


def test_ehr_check_fails_when_the_physician_has_no_epic_provider_id(runtime, world, live, epic_web_ehr):
    """`ehr check` of an Epic clinic whose Practitioners carry no identifier the web service can be
    asked with (no `type.text` EXTERNAL, or a wrong `--epic-provider-id-system`): it reported
    `ok`, "GetProviderAppointments answered ... (0 listed)", without calling Epic at all, while every
    night skips every physician. It now fails on `appointments`, naming the missing identifier and
    the flags that fix it; with `--epic-provider-id-type NPI` it asks Epic and passes."""
    settings = runtime.settings
    org_id, night, start, _ = epic_clinic(runtime, world, epic_web_ehr, live, "--epic-user-id", "SVCAUTH",
                                          "--epic-patient-id-system", PATIENT_SYSTEM)
    epic_web_ehr.seed(practitioner("pr-ana", "1417000001", "Lopez", "Ana"),
                      practitioner("pr-ben", "1417000019", "Okafor", "Ben"))
    done = cli(settings, "ehr", "check", "--org", org_id, "--json")
    verdict = json.loads(done.stdout)
    step = verdict["steps"][-1]
    assert done.returncode == 1 and not verdict["ok"], verdict
    assert step["step"] == "appointments" and not step["ok"], step
    for needle in ("no Epic provider id (an identifier whose type.text is EXTERNAL)", "--epic-provider-id-system",
                   "--epic-provider-id-type NPI"):
        assert needle in step["detail"], step
    assert epic_web_ehr.epic()["calls"] == []

    assert cli(settings, "orgs", "update", "--org", org_id, "--epic-provider-id-type", "NPI").returncode == 0
    done = cli(settings, "ehr", "check", "--org", org_id, "--json")
    verdict = json.loads(done.stdout)
    assert done.returncode == 0 and verdict["ok"], verdict
    assert "Epic's GetProviderAppointments answered for NPI 1417000001" in verdict["steps"][-1]["detail"]
    assert [c["Providers"] for c in epic_web_ehr.epic()["calls"]] == [[{"ID": "1417000001", "IDType": "NPI"}]]


def seed_restricted(ehr, start: dt.datetime) -> dt.datetime:
    """`seed_schedule`, with Vic, a VIP patient, on Ana's schedule that night and, as Jane, in the
    next hours (what `ehr check` reads); patients named by their FHIR id (each one a Patient read).
    The moment of the next hours' appointments."""
    seed_schedule(ehr, start)
    soon = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None, second=0, microsecond=0) + dt.timedelta(hours=3)
    ehr.seed(epic_patient("pt-vip", "Star", "Vic", "1966-03-04", "male", "Z1003"),
             appointment("ana-vip", "pr-ana", "pt-vip", start + dt.timedelta(days=2, hours=6)),
             appointment("ana-soon-vip", "pr-ana", "pt-vip", soon),
             appointment("ana-soon", "pr-ana", "pt-1", soon + dt.timedelta(hours=1)))
    ehr.epic(fhir_patient_ids=True)
    return soon


def hub_page(settings, live, user) -> str:
    """The physician's hub page, as `serve` renders it (their appointments of the next 7 days)."""
    return hub_page_at(settings, live, user.id)


@pytest.mark.gen_test(timeout=600)
async def test_a_restricted_patient_is_left_out_and_counted(api, runtime, world, live, epic_web_ehr):
    """A restricted patient (break-the-glass: Epic answers their Patient read 403 with an
    OperationOutcome, every other patient reads fine): one such patient on Ana's schedule failed the
    whole clinic's night, every night ("The EHR refused svc-auth's access"). Now that appointment is
    left out and counted; the night publishes everyone else, and `ehr check` says so."""
    settings = runtime.settings
    org_id, night, start, (ana, _, _, _) = epic_clinic(runtime, world, epic_web_ehr, live, "--epic-user-id",
                                                       "SVCAUTH", "--epic-patient-id-system", PATIENT_SYSTEM)
    seed_restricted(epic_web_ehr, start)
    epic_web_ehr.epic(restricted=["pt-vip"])
    code, report = night_of(settings, night)
    assert code == 0 and org_id in report["built"], report
    assert report["skipped"][org_id] == {
        "patient restricted by Epic (Patient read refused, HTTP 403)": {"count": 1, "appointments": ["ana-vip"]},
        "unknown Epic status": {"count": 1, "appointments": ["ana-bumped"]}}, report
    headers = await partner_headers(api, world.app, world.secret)
    rows = await listed(api, headers, org_id)
    assert sorted(r["id"] for r in rows) == sorted(EXPECTED + ["ana-ghost"])
    assert {r["patient"]["id"] for r in rows} == {"pt-1", "pt-2", "pt-ghost"}
    assert Snapshot.latest_complete(org_id).skipped and "ana-vip" in Snapshot.latest_complete(org_id).skipped

    done = cli(settings, "ehr", "check", "--org", org_id, "--json")
    verdict = json.loads(done.stdout)
    detail = verdict["steps"][-1]["detail"]
    assert done.returncode == 0 and verdict["ok"], verdict
    assert "(1 listed in the next 24 hours; 1 Patient read(s) refused by Epic (restricted" in detail, detail

    # Ana's hub page (the next 7 days: Jane at the next hours, Vic restricted): Jane, no error.
    page = hub_page(settings, live, ana)
    assert "JANE" in page.upper() and "appointments-error" not in page and "STAR" not in page.upper(), page


def test_every_patient_read_refused_fails_the_night_naming_it(runtime, world, live, epic_web_ehr):
    """When Epic refuses EVERY Patient read (the backend client lacks Patient.Read, an Epic user who
    may see no patient), leaving each appointment out would publish an empty snapshot as if fine:
    the clinic's night fails naming the cause, nothing is published, and `ehr check` fails the same way."""
    settings = runtime.settings
    org_id, night, start, (ana, _, _, _) = epic_clinic(runtime, world, epic_web_ehr, live, "--epic-user-id",
                                                       "SVCAUTH", "--epic-patient-id-system", PATIENT_SYSTEM)
    seed_restricted(epic_web_ehr, start)
    epic_web_ehr.epic(restricted=["pt-1", "pt-2", "pt-ghost", "pt-vip"])
    code, report = night_of(settings, night)
    failure = report["organizations"][org_id]
    assert code == 1 and failure.startswith("failed: Epic refused every Patient read (4, none answered; e.g. "), report
    for needle in ("OperationOutcome issue forbidden", "lacks Patient.Read", "'SVCAUTH'", "nothing was published"):
        assert needle in failure, failure
    assert "break the glass" not in failure, failure       # Epic's own words: the operator's `ehr check` only
    assert org_id not in report["built"] and org_id not in report["skipped"]
    assert Snapshot.latest_complete(org_id) is None
    assert Snapshot.select().where(Snapshot.organization == org_id).count() == 0

    done = cli(settings, "ehr", "check", "--org", org_id, "--json")
    step = json.loads(done.stdout)["steps"][-1]
    assert done.returncode == 1 and step["step"] == "appointments" and not step["ok"], step
    assert "Epic refused every Patient read (2, none answered" in step["detail"], step
    page = hub_page(settings, live, ana)       # the hub says why, never "no appointments"
    assert "appointments-error" in page and "Epic refused every Patient read" in page, page

    epic_web_ehr.epic(restricted=["pt-vip"])       # one patient read answered: the night is built
    code, report = night_of(settings, night)
    assert code == 0 and org_id in report["built"], report
