"""FHIR Bulk Data export (issue 48; CONTRACTS "Bulk Data export for backend apps"): Groups, kick-off,
status, manifest, files and DELETE, over real HTTP against a `svc-auth serve` process (its embedded
worker), on both databases; the kick-off's parameters and the Groups through their domain functions."""
from __future__ import annotations

import datetime as dt
import json
import time

import pytest

from bulk.build import at_most_every
from bulk.files import export_prefix
from bulk.groups import CLINIC_GROUP, group_ids, group_resource, members
from bulk.params import PATIENT_TYPES, SYSTEM_TYPES, parse_kickoff, query_values
from fhir_api.outcome import FhirError
from helpers.bulk import KICKOFF_HEADERS, BulkClient, schedule_patients, sync_window_closed_now
from helpers.fhir_api import outcome
from helpers.processes import wait_until
from helpers.r4 import r4_problems
from helpers.tokens import mint_platform_token
from helpers.worlds import clinic
from lifecycle.applications import install_application, register_application
from lifecycle.users import create_user
from models.bulk import BulkExport, BulkExportFile
from models.disclosures import DisclosureRecord
from storage.local import LocalObjectStore

BASE = "http://127.0.0.1:8888/fhir/r4/org"
NOW = dt.datetime(2026, 6, 1, 12, 0)
pytestmark = pytest.mark.svc_settings(sync_window=sync_window_closed_now())  # the night never replaces a test's schedule


def _parse(level="patient", lenient=False, post=False, **args):
    return parse_kickoff(level, {k: (v if isinstance(v, list) else [v]) for k, v in args.items()}, BASE, NOW,
                         lenient, post)


def _refused(**kwargs) -> str:
    with pytest.raises(FhirError) as caught:
        _parse(**kwargs)
    assert caught.value.status == 400
    return caught.value.message


@pytest.mark.parametrize("meta", ["x", ["a"], {"tag": "x"}, {"tag": ["x", None, {"code": "SUBSETTED"}]}, None])
def test_elements_subset_a_resource_whose_meta_the_ehr_sent_malformed(meta):
    """An EHR's resource with `meta` (or `meta.tag`) not the object (list of objects) FHIR says:
    `_elements` raised on it, and the whole export failed after its retries. Now the malformed part
    is dropped and the file is written, tagged SUBSETTED once."""
    from bulk.files import SUBSETTED, subset
    kept = subset({"resourceType": "Patient", "id": "p1", "gender": "female", "birthDate": "1980", "meta": meta},
                  ((None, "gender"),))
    assert set(kept) == {"resourceType", "id", "gender", "meta"} and kept["meta"]["tag"] == [SUBSETTED]


def test_a_build_asks_whether_it_holds_its_job_at_most_once_per_interval():
    """`bulk.build.HOLDS_SECONDS`: the sandbox's quick searches share one read; a False stops the build."""
    asked = []
    live = at_most_every(0.3, lambda: asked.append(1) or len(asked) < 2)
    assert all(live() for _ in range(1000)) and len(asked) == 1
    time.sleep(0.35)
    assert not live() and len(asked) == 2


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_kickoff_parameters_are_checked_as_the_specification_and_contract_say(runtime):
    assert _parse().types == PATIENT_TYPES and _parse("system").types == SYSTEM_TYPES
    assert "Practitioner" in SYSTEM_TYPES and "Practitioner" not in PATIENT_TYPES
    assert _parse(_type="Observation,Patient", ).types == ("Patient", "Observation")
    assert _parse(_type=["Observation", "Condition"]).types == ("Condition", "Observation")
    assert "Practitioner" in _refused(_type="Patient,Practitioner")  # not a Patient-level type
    assert _parse(lenient=True, _type="Patient,Practitioner,Nonsense").types == ("Patient",)
    assert _parse(_since="2026-01-01T00:00:00Z").since == "2026-01-01T00:00:00Z"
    assert _parse(_since="2026-01-01T05:00:00+05:00").since == "2026-01-01T00:00:00Z"
    assert "future" in _refused(_since="2026-06-02T00:00:00Z")
    for bad in ("2026-01-01", "yesterday", "2026-13-01T00:00:00Z", "2026-01-01T00:00:00"):
        assert "_since" in _refused(_since=bad)
    for good in ("application/fhir+ndjson", "application/ndjson", "ndjson"):
        assert _parse(_outputFormat=good).output_format == good
    assert "_outputFormat" in _refused(_outputFormat="text/csv")
    # `?_outputFormat=application/fhir+ndjson` typed unencoded: its `+` arrives a space (400 before).
    for post in (False, True):  # a GET's query, or a POST's URL
        typed = query_values({"_outputFormat": [b"application/fhir ndjson"]})
        assert parse_kickoff("patient", typed, BASE, NOW, False, post).output_format == "application/fhir+ndjson"
    assert "_outputFormat" in _refused(post=True, _outputFormat="application/fhir ndjson")  # JSON has no such excuse
    assert _parse(_elements="Observation.code,status").elements == (("Observation", "code"), (None, "status"))
    assert "_elements" in _refused(_elements="code.coding")
    assert _parse(_typeFilter="Observation?category=laboratory").type_filters == (("Observation", "category=laboratory"),)
    assert _parse(_type="Patient", _typeFilter="Observation?category=laboratory").type_filters == ()
    assert _parse(_typeFilter="Observation?nonsense=1").type_filters  # lenient: unknown parameter ignored
    assert "date" in _refused(_typeFilter="Observation?date=notadate")
    # The filter's own search refused it, not the kick-off's parameters (`patient` may repeat there):
    # "The patient parameter is repeated." named no _typeFilter.
    for bad in ("Observation?patient=a&patient=b", "Observation?date=notadate", "Observation?_count=0"):
        assert _refused(_typeFilter=bad).startswith("_typeFilter: "), bad
    assert "_typeFilter" in _refused(_typeFilter="Nonsense?x=1")
    assert _parse(includeAssociatedData="LatestProvenanceResources").types == PATIENT_TYPES
    assert _parse(post=True, patient=["Patient/pat-1", f"{BASE}/Patient/pat-2"]).patients == ("pat-1", "pat-2")
    assert "system-level" in _refused(level="system", post=True, patient="Patient/pat-1")
    assert "POST" in _refused(patient="Patient/pat-1")
    assert "Patient/" in _refused(post=True, patient="Observation/x")


def test_groups_are_each_authorized_physicians_schedule_and_the_clinic(runtime, world):
    mine = schedule_patients(world.org, world.physician, world.app, 4)
    second = create_user(world.org.id, "two@example.com", "Sec", "Ond", "sond", npi="1245319599")
    theirs = schedule_patients(world.org, second, world.app, 3, first=2, day=dt.date.today() - dt.timedelta(days=1))
    unauthorized = create_user(world.org.id, "three@example.com", "Thi", "Rd", "trd", npi="1003000126")
    schedule_patients(world.org, unauthorized, world.app, 2, first=10)
    from models.application import Authorization
    Authorization.delete().where(Authorization.user == unauthorized.id).execute()
    ids = group_ids(world.org.id)
    assert ids[0] == CLINIC_GROUP and len(ids) == 3
    clinic_group = group_resource(world.org.id, CLINIC_GROUP)
    assert clinic_group["quantity"] == len(set(mine) | set(theirs)) == 5
    assert [m["entity"]["reference"] for m in clinic_group["member"]] == [f"Patient/{p}" for p in sorted(set(mine) | set(theirs))]
    by_physician = {g: group_resource(world.org.id, g) for g in ids[1:]}
    assert sorted(g["quantity"] for g in by_physician.values()) == [3, 4]
    assert [p for batch in members(world.org.id, CLINIC_GROUP, page=2) for p in batch] == sorted(set(mine) | set(theirs))
    assert r4_problems([clinic_group, *by_physician.values()]) == [[], [], []]
    with pytest.raises(FhirError) as caught:
        group_resource(world.org.id, "physician-usr-nobody")
    assert caught.value.status == 404


@pytest.fixture
def exporter(live, runtime, world):
    """A clinic with 5 scheduled patients, and a backend of the installed app with a clinic-wide token."""
    patients = schedule_patients(world.org, world.physician, world.app, 5)
    token = mint_platform_token(runtime, live, world.physician, world.app, world.org.id)
    return BulkClient(f"{live}/fhir/r4/{world.org.id}", token), patients


def _validate(resources: list[dict]) -> None:
    problems = r4_problems(resources)
    bad = [(r["resourceType"], r["id"], p) for r, p in zip(resources, problems) if p]
    assert bad == [], bad[:3]


def test_a_patient_export_end_to_end(exporter, runtime, world):
    client, patients = exporter
    status, headers, body = client.kick_off("/Patient/$export", {"_type": "Patient,Observation,DocumentReference,Condition"})
    assert status == 202, body
    url = headers["Content-Location"]
    assert url.startswith(client.base + "/$export-status/")
    # The kick-off's record holds the HTTP status it answered (CONTRACTS, "Disclosure audit": `status`).
    kickoff = DisclosureRecord.get(DisclosureRecord.action == "bulk.kickoff")
    assert (kickoff.outcome, kickoff.status, kickoff.request_id) == ("success", 202, headers["X-Request-Id"])
    assert kickoff.resource_ids == [url.rpartition("/")[2]]
    first = client.status(url)  # the first poll is always 202
    assert first[0] == 202 and first[1]["X-Progress"] and first[1]["Retry-After"]
    manifest = client.wait(url)
    assert manifest["requiresAccessToken"] is True and manifest["error"] == []
    assert manifest["request"] == client.base + "/Patient/$export?_type=Patient%2CObservation%2CDocumentReference%2CCondition"
    assert manifest["transactionTime"].endswith("Z")
    kinds = [o["type"] for o in manifest["output"]]
    assert kinds == ["Patient", "Condition", "DocumentReference", "Observation"]
    everything = []
    for output in manifest["output"]:
        found = client.download(output["url"])
        assert len(found) == output["count"] and {r["resourceType"] for r in found} == {output["type"]}
        everything += found
    assert sorted(r["id"] for r in everything if r["resourceType"] == "Patient") == sorted(patients)
    for document in (r for r in everything if r["resourceType"] == "DocumentReference"):
        for content in document["content"]:
            attachment = content["attachment"]
            assert attachment["contentType"] and (attachment.get("data") or attachment.get("url", "").startswith("http"))
    _validate(everything)
    # Each download is a disclosure record naming every patient in its file.
    downloads = list(DisclosureRecord.select().where(DisclosureRecord.action == "bulk.download"))
    assert len(downloads) == 4 and all(set(r.patients) == set(patients) for r in downloads)
    # DELETE: the job and its files are gone.
    status, _, _ = client.request("DELETE", url)
    assert status == 202
    status, headers, body = client.status(url)
    assert status == 404 and headers["Content-Type"].startswith("application/json") and outcome(body) == "not-found"
    assert client.request("GET", manifest["output"][0]["url"])[0] == 404
    assert BulkExportFile.select().count() == 0 and BulkExport.select().count() == 0
    # Nor is its directory kept in the embedded store (one per export, for ever, before).
    store = runtime.batch_object_store
    assert isinstance(store, LocalObjectStore)
    assert not store.path_of(export_prefix(url.rsplit("/", 1)[1]).rstrip("/")).exists()
    assert store.root.is_dir()


def test_deleting_an_app_deletes_its_exports_files(exporter, runtime, world):
    """`apps delete` cascaded to the app's exports but left their files in the object store for ever
    (the expiry sweep finds them through those rows). They go first now."""
    from bulk.files import export_prefix
    from lifecycle.applications import delete_application
    client, _ = exporter
    status, headers, body = client.kick_off("/Patient/$export", {"_type": "Patient"})
    assert status == 202, body
    export_id = headers["Content-Location"].rsplit("/", 1)[1]
    assert client.wait(headers["Content-Location"])["output"]
    assert list(runtime.batch_object_store.list_keys(export_prefix(export_id)))
    delete_application(runtime, world.app.id)
    assert list(runtime.batch_object_store.list_keys(export_prefix(export_id))) == []
    assert BulkExport.select().count() == 0 and BulkExportFile.select().count() == 0


def test_kickoff_refusals(exporter, runtime, world, live):
    client, _ = exporter
    status, _, body = client.kick_off(headers={"Accept": "application/fhir+json"})
    assert status == 400 and "respond-async" in body["issue"][0]["diagnostics"]
    status, _, body = client.kick_off(headers={"Prefer": "respond-async"})
    assert status == 400 and "Accept" in body["issue"][0]["diagnostics"]
    status, _, body = client.kick_off(params={"_since": "2999-01-01T00:00:00Z"})
    assert status == 400 and outcome(body) == "invalid"
    assert client.kick_off(params={"_outputFormat": "text/csv"})[0] == 400
    assert client.kick_off("/$export", parameters={"resourceType": "Parameters", "parameter": [
        {"name": "patient", "valueReference": {"reference": "Patient/pat-x"}}]})[0] == 400
    assert client.kick_off("/Group/physician-usr-nobody/$export")[0] == 404
    assert BulkClient(client.base, None).kick_off()[0] == 401
    for path in ("/$export", "/Group/clinic/$export", "/$export-status/x", "/$export-file/x/Patient-1.ndjson", "/Group"):
        assert client.request("OPTIONS", path)[0] == 204, path  # a preflight, never a 500
    # Another clinic's FHIR base: 404, never revealed.
    other, _ = clinic("Other Clinic", "https://ehr.example/other")
    assert BulkClient(client.base.rsplit("/", 1)[0] + f"/{other.id}", client.token).kick_off()[0] == 404
    # A body nested 20,000 deep, or not JSON: 400.
    deep = b'{"resourceType":"Parameters","parameter":' + b"[" * 20000 + b"]" * 20000 + b"}"
    status, _, _ = client.request("POST", "/Patient/$export", deep, {**KICKOFF_HEADERS, "Content-Type": "application/fhir+json"})
    assert status == 400
    assert client.request("POST", "/Patient/$export", b"\x00", {**KICKOFF_HEADERS, "Content-Type": "application/json"})[0] == 400
    # A member repeated in the body is refused naming it, never taken last-wins (as a repeated query parameter).
    repeated = b'{"resourceType":"Parameters","parameter":[{"name":"_type","valueString":"Group","valueString":"Patient"}]}'
    status, _, raw = client.request("POST", "/Patient/$export", repeated,
                                    {**KICKOFF_HEADERS, "Content-Type": "application/fhir+json"})
    assert status == 400 and "valueString" in json.loads(raw)["issue"][0]["diagnostics"], raw
    assert BulkExport.select().count() == 0


def test_a_clinic_id_sent_percent_encoded_kicks_off_as_written_plainly(exporter, world, live):
    """The request URL was cut at the clinic id as decoded, so `/fhir/r4/%61bc/$export` raised
    IndexError: a 500 before any token was looked at. Now it is the clinic's kick-off (401 without a
    token), and the manifest's `request` is the export's URL."""
    client, _ = exporter
    encoded = "".join(f"%{ord(c):02X}" if i == 0 else c for i, c in enumerate(world.org.id))
    anonymous = BulkClient(f"{live}/fhir/r4/{encoded}", None)
    assert anonymous.kick_off("/Patient/$export")[0] == 401
    status, headers, body = BulkClient(f"{live}/fhir/r4/{encoded}", client.token).kick_off("/Patient/$export")
    assert status == 202, body
    assert client.wait(headers["Content-Location"])["request"] == client.base + "/Patient/$export"


def test_a_since_whose_utc_leaves_the_date_range_is_a_recorded_400(exporter):
    """`_since` valid as written but outside years 1-9999 once in UTC (GET query or POST
    `valueInstant`): a 400 OperationOutcome, never a 500, recorded as every refused kick-off."""
    client, _ = exporter
    refusals = 0
    for since in ("0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"):
        for sent in ({"params": {"_since": since}},
                     {"parameters": {"resourceType": "Parameters",
                                     "parameter": [{"name": "_since", "valueInstant": since}]}}):
            status, headers, body = client.kick_off("/Patient/$export", **sent)
            assert status == 400 and outcome(body) == "invalid", (since, sent, status, body)
            assert "_since" in body["issue"][0]["diagnostics"] and headers["Content-Type"].startswith("application/fhir+json")
            refusals += 1
    refused = DisclosureRecord.select().where((DisclosureRecord.action == "bulk.kickoff")
                                              & (DisclosureRecord.outcome == "failure") & (DisclosureRecord.status == 400))
    assert refused.count() == refusals == 4
    assert BulkExport.select().count() == 0


def test_a_type_filter_value_the_fhir_api_refuses_is_a_recorded_400(exporter):
    """`_typeFilter` is the FHIR API's search of the type, so a value its search refuses (a NUL or
    other control character, not UTF-8, longer than 512 characters, once the filter's own query is
    decoded) is a 400 here too; they were taken (202) and the export ran with a filter nobody could
    have sent to the FHIR API. A GET query (the filter encoded twice) and a POST `valueString` alike."""
    client, _ = exporter
    bad = ("Observation?code=x%00", "Observation?code=%FF", "Observation?code=" + "x" * 600,
           "Observation?code=%1F")
    sent = 0
    for value in bad:
        for how in ({"params": {"_typeFilter": value}},
                    {"parameters": {"resourceType": "Parameters", "parameter": [{"name": "_typeFilter",
                                                                                 "valueString": value}]}}):
            status, _, body = client.kick_off("/Patient/$export", **how)
            assert status == 400 and outcome(body) == "invalid", (value[:40], how.keys(), status, body)
            assert "_typeFilter" in body["issue"][0]["diagnostics"], body
            sent += 1
    lone = {"resourceType": "Parameters", "parameter": [{"name": "_typeFilter", "valueString": "Observation?code=\ud800"}]}
    status, _, body = client.kick_off("/Patient/$export", parameters=lone)  # a lone surrogate: POST only
    assert status == 400 and "_typeFilter" in body["issue"][0]["diagnostics"], body
    sent += 1
    refused = DisclosureRecord.select().where((DisclosureRecord.action == "bulk.kickoff")
                                              & (DisclosureRecord.status == 400))
    assert refused.count() == sent and BulkExport.select().count() == 0
    status, _, body = client.kick_off("/Patient/$export", {"_typeFilter": "Observation?code=%E4%B8%80"})
    assert status == 202, body  # non-ASCII, encoded twice: fine


def test_post_kickoff_with_patients_elements_and_type_filter(exporter):
    client, patients = exporter
    parameters = {"resourceType": "Parameters", "parameter": [
        {"name": "_type", "valueString": "Patient,Observation"},
        {"name": "_elements", "valueString": "Observation.code,Observation.subject,gender"},
        {"name": "_typeFilter", "valueString": "Observation?code=http://loinc.org|8867-4"},
        {"name": "includeAssociatedData", "valueCode": "LatestProvenanceResources"},
        {"name": "patient", "valueReference": {"reference": f"Patient/{patients[0]}"}},
        {"name": "patient", "valueReference": {"reference": "Patient/pat-0000000000000000"}}]}  # unknown: still 202
    status, headers, body = client.kick_off("/Patient/$export", parameters=parameters)
    assert status == 202, body
    manifest = client.wait(headers["Content-Location"])
    files = {o["type"]: client.download(o["url"]) for o in manifest["output"]}
    assert [p["id"] for p in files["Patient"]] == [patients[0]]
    assert set(files["Patient"][0]) == {"resourceType", "id", "meta", "gender"}
    assert files["Observation"] and all(set(o) == {"resourceType", "id", "meta", "code", "subject"}
                                        for o in files["Observation"])
    assert all(o["code"]["coding"][0]["code"] == "8867-4" for o in files["Observation"])
    assert all(o["subject"]["reference"] == f"Patient/{patients[0]}" for o in files["Observation"])
    tag = files["Observation"][0]["meta"]["tag"]
    assert tag == [{"system": "http://terminology.hl7.org/CodeSystem/v3-ObservationValue", "code": "SUBSETTED"}]


def test_a_subsetted_file_download_names_every_patient_whose_resources_it_holds(exporter, runtime, world):
    """`_elements=code` drops `subject` from each Observation; the file still holds every patient's
    Observations, so its `bulk.download` record names each of them (docs/audit.md)."""
    from connectors import ResourceQuery, connector_for
    client, patients = exporter
    connector = connector_for(runtime, world.org)
    expected = {p for p in patients if list(connector.search_resources(ResourceQuery("Observation", patient=p, count=1)))}
    assert len(expected) > 1
    status, headers, body = client.kick_off("/Patient/$export", {"_type": "Observation", "_elements": "code"})
    assert status == 202, body
    manifest = client.wait(headers["Content-Location"])
    for output in manifest["output"]:
        found = client.download(output["url"])
        assert found and all("subject" not in o for o in found)
    downloads = list(DisclosureRecord.select().where(DisclosureRecord.action == "bulk.download"))
    assert len(downloads) == len(manifest["output"]) >= 1
    assert set().union(*(set(r.patients) for r in downloads)) == expected


def test_group_and_system_exports(exporter, world):
    client, patients = exporter
    bundle_status, _, raw = client.request("GET", "/Group", headers={"Accept": "application/fhir+json"})
    groups = json.loads(raw)
    assert bundle_status == 200 and groups["total"] == 2
    physician_group = next(e["resource"] for e in groups["entry"] if e["resource"]["id"] != CLINIC_GROUP)
    status, headers, _ = client.kick_off(f"/Group/{physician_group['id']}/$export", {"_type": "Patient"})
    assert status == 202
    manifest = client.wait(headers["Content-Location"])
    assert sorted(r["id"] for r in client.download(manifest["output"][0]["url"])) == sorted(patients)
    status, headers, _ = client.kick_off("/$export", {"_type": "Patient,Practitioner,Organization"})
    assert status == 202
    manifest = client.wait(headers["Content-Location"])
    assert [o["type"] for o in manifest["output"]] == ["Patient", "Organization", "Practitioner"]


def test_group_search_honours_id_count_and_offset_with_next_links_and_400s(exporter, world):
    """`GET {iss}/Group` answered every Group whatever `_count` and `_id` said (and any other
    parameter, even `_count=ten`), with no `next` link. It is searched as the FHIR API searches:
    `_id`, `_count` (1 to 100) and `_offset`, a `next` link while more remain, a 400 for a malformed
    value, an unknown parameter ignored and left out of `self` (a 400 with `handling=strict`)."""
    client, _ = exporter
    accept = {"Accept": "application/fhir+json"}

    def groups(query: str = "", headers: dict | None = None):
        status, _, raw = client.request("GET", f"/Group{query}", headers={**accept, **(headers or {})})
        return status, json.loads(raw)

    def ids(bundle):
        return [e["resource"]["id"] for e in bundle["entry"] if e["search"]["mode"] == "match"]

    def link(bundle, relation):
        return next((l["url"] for l in bundle["link"] if l["relation"] == relation), None)

    status, every = groups()
    assert status == 200 and every["total"] == 2 and link(every, "next") is None, every
    physician = next(i for i in ids(every) if i != CLINIC_GROUP)
    status, first = groups("?_count=1")
    assert status == 200 and first["total"] == 2 and ids(first) == [CLINIC_GROUP], first
    assert link(first, "self") == f"{client.base}/Group?_count=1"
    assert link(first, "next") == f"{client.base}/Group?_count=1&_offset=1", first["link"]
    status, _, raw = client.request("GET", link(first, "next"), headers=accept)
    second = json.loads(raw)
    assert status == 200 and ids(second) == [physician] and link(second, "next") is None, second
    status, one = groups(f"?_id={physician}")
    assert status == 200 and one["total"] == 1 and ids(one) == [physician], one
    status, both = groups(f"?_id=nobody,{CLINIC_GROUP},{physician}")
    assert status == 200 and ids(both) == [CLINIC_GROUP, physician], both
    assert groups("?_id=nobody")[1]["total"] == 0
    status, lenient = groups("?foo=bar&_count=5")
    assert status == 200 and lenient["total"] == 2 and link(lenient, "self") == f"{client.base}/Group?_count=5"
    for query in ("?_count=ten", "?_count=0", "?_count=-1", "?_offset=x", "?_id=", "?_id=a%20b", "?_count=1&_count=2"):
        status, body = groups(query)
        assert status == 400 and outcome(body) == "invalid", (query, body)
    status, body = groups("?foo=bar", {"Prefer": "handling=strict"})
    assert status == 400 and "foo" in body["issue"][0]["diagnostics"], body
    status, _, raw = client.request("GET", "/metadata", headers=accept)
    served = {r["type"]: r for r in json.loads(raw)["rest"][0]["resource"]}
    assert status == 200 and served["Group"]["searchParam"] == [{"name": "_id", "type": "token"}]


def test_a_patient_scope_reads_no_group(exporter, runtime, world, live):
    """A Group lists other patients: a launch's `patient/*.rs` with a patient context reads none of
    them (403 forbidden); the clinic-wide `user/*.rs` token still does."""
    client, patients = exporter
    accept = {"Accept": "application/fhir+json"}
    status, _, raw = client.request("GET", "/Group", headers=accept)
    assert status == 200
    ids = [e["resource"]["id"] for e in json.loads(raw)["entry"]]
    assert CLINIC_GROUP in ids and any(i.startswith("physician-") for i in ids)
    launch = BulkClient(client.base, mint_platform_token(runtime, live, world.physician, world.app, world.org.id,
                                                         scope="openid launch/patient patient/*.rs", patient=patients[0]))
    for path in ("/Group", *(f"/Group/{i}" for i in ids)):
        status, _, raw = launch.request("GET", path, headers=accept)
        body = json.loads(raw)
        assert status == 403 and outcome(body) == "forbidden", (path, status, body)
        assert "patient/ scope does not reach Group" in body["issue"][0]["diagnostics"]
    assert client.request("GET", f"/Group/{CLINIC_GROUP}", headers=accept)[0] == 200
    assert launch.request("GET", f"/Patient/{patients[0]}", headers=accept)[0] == 200  # its own patient, still


def test_only_the_exporting_app_sees_its_export_and_scopes_cover_each_file(exporter, runtime, world, live):
    client, _ = exporter
    status, headers, _ = client.kick_off("/Patient/$export", {"_type": "Patient,Condition"})
    url = headers["Content-Location"]
    manifest = client.wait(url)
    other_app, _ = register_application(runtime, "Other", "https://other.example/app", "https://other.example/launch")
    install_application(other_app.id, world.org.id)
    other = BulkClient(client.base, mint_platform_token(runtime, live, world.physician, other_app, world.org.id))
    assert other.status(url)[0] == 404
    assert other.request("GET", manifest["output"][0]["url"])[0] == 404
    assert other.request("DELETE", url)[0] == 404
    # Polls and DELETEs are no disclosures; kick-offs are recorded (no patients).
    assert not DisclosureRecord.select().where(DisclosureRecord.action.in_(("bulk.status", "bulk.delete"))).exists()
    assert DisclosureRecord.select().where((DisclosureRecord.action == "bulk.kickoff")
                                           & (DisclosureRecord.outcome == "success")).count() == 1
    narrow = BulkClient(client.base, mint_platform_token(runtime, live, world.physician, world.app, world.org.id,
                                                         scope="openid user/Patient.rs"))
    by_type = {o["type"]: o["url"] for o in manifest["output"]}
    assert narrow.request("GET", by_type["Patient"])[0] == 200
    assert narrow.request("GET", by_type["Condition"])[0] == 403
    # A file name whose part is digits only to `str.isdigit` (², Arabic-Indic) names no file: 404.
    for odd in ("%C2%B2", "%D9%A1"):
        assert client.request("GET", by_type["Patient"].replace("Patient-1.ndjson", f"Patient-{odd}.ndjson"))[0] == 404
    # Narrow scopes export only what they reach; a type named that they do not reach is a 403.
    assert narrow.kick_off(params={"_type": "Condition"})[0] == 403
    assert narrow.kick_off(params={"_type": "Patient,Condition"}, headers={
        **KICKOFF_HEADERS, "Prefer": "respond-async, handling=lenient"})[0] == 202


def test_a_patient_scope_of_the_exporting_app_cannot_poll_delete_or_download(exporter, runtime, world, live):
    """A launch token of the exporting app with `patient/*.rs` (with or without a patient context)
    gets the kick-off's 403 at the status URL, its DELETE and each file; the exporting token's
    scopes still get everything."""
    client, patients = exporter
    status, headers, _ = client.kick_off("/Patient/$export", {"_type": "Patient,Condition"})
    assert status == 202
    url = headers["Content-Location"]
    manifest = client.wait(url)
    scopes = ({"scope": "openid launch/patient patient/*.rs", "patient": patients[0]}, {"scope": "openid patient/*.rs"})
    for claims in scopes:
        launch = BulkClient(client.base, mint_platform_token(runtime, live, world.physician, world.app, world.org.id,
                                                             **claims))
        answers = [launch.status(url), *(launch.request("GET", o["url"]) for o in manifest["output"]),
                   launch.request("DELETE", url), launch.kick_off(), launch.kick_off("/$export", {"_type": "Practitioner"})]
        for status, _, body in answers:
            body = body if isinstance(body, dict) or body is None else json.loads(body)
            assert status == 403 and outcome(body) == "forbidden", (claims, status, body)
            assert "patient/ scope cannot export" in body["issue"][0]["diagnostics"], (claims, body)
    assert client.status(url)[0] == 200  # not deleted
    assert all(client.request("GET", o["url"])[0] == 200 for o in manifest["output"])
    assert BulkExport.select().count() == 1
    assert client.request("DELETE", url)[0] == 202


@pytest.mark.svc_settings(bulk_max_concurrent=1, sync_window=sync_window_closed_now())
def test_concurrent_exports_per_app_are_limited(exporter):
    client, _ = exporter
    # The sandbox's latency holds the first export running while the second kick-off arrives.
    from models.directory import Organization
    Organization.update(ehr_url="https://ehr.example/test?latency=0.2").execute()
    status, headers, _ = client.kick_off()
    assert status == 202
    status, busy, body = client.kick_off()
    assert status == 429 and int(busy["Retry-After"]) > 0 and outcome(body) == "throttled"
    assert client.request("DELETE", headers["Content-Location"])[0] == 202
    # The DELETEd export counts until its build has stopped (at its next search: bulk.build).
    wait_until(lambda: not BulkExport.select().exists(), 30, "the deleted export's build stopped")
    # Kick-offs arriving together are counted one at a time: exactly one gets in.
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(6) as pool:
        statuses = sorted(pool.map(lambda _: client.kick_off()[0], range(6)))
    assert statuses == [202, 429, 429, 429, 429, 429]


def test_metadata_declares_bulk_data(live, world):
    from helpers.fhir_api import Fhir
    body = Fhir(live, world.org.id, None).ok("/metadata")
    assert "http://hl7.org/fhir/uv/bulkdata/CapabilityStatement/bulk-data" in body["instantiates"]
    rest = body["rest"][0]
    assert {"name": "export", "definition": "http://hl7.org/fhir/uv/bulkdata/OperationDefinition/export"} in rest["operation"]
    served = {r["type"]: r for r in rest["resource"]}
    assert served["Patient"]["operation"] == [
        {"name": "patient-export", "definition": "http://hl7.org/fhir/uv/bulkdata/OperationDefinition/patient-export"}]
    assert served["Group"]["operation"] == [
        {"name": "group-export", "definition": "http://hl7.org/fhir/uv/bulkdata/OperationDefinition/group-export"}]
    uris = {e["url"]: e["valueUri"] for e in rest["security"]["extension"][0]["extension"]}
    assert uris["token"] == f"{live}/v1/oauth/token"
    assert r4_problems([body]) == [[]]


@pytest.mark.slow
def test_a_fhir_clinic_exports_what_its_ehr_holds_through_the_connector(runtime, world, live, fhir_ehr):
    """A clinic on a real FHIR EHR: the export reads it through the connector (searches by patient,
    within the batch bounds), with the platform's references only and nothing of another server."""
    from helpers.fhir_ehr import appointment, chart_record, connect_clinic, patient, practitioner
    from models.directory import Organization
    org_id = connect_clinic(runtime.settings, fhir_ehr, f"{live}/ehr/jwks.json", name="Bulk FHIR Clinic")
    monday = dt.datetime(2026, 3, 2, 9, 0)
    fhir_ehr.seed(practitioner("pr-bulk", "1417000043", "Lopez", "Ana"),
                  patient("pt-x", "Doe", "Jane", "1970-01-02", "female"), patient("pt-y", "Roe", "Rick", "1955-06-30", "male"),
                  patient("pt-z", "Poe", "Zed", "1960-01-01", "male"),
                  appointment("bulk-1", "pr-bulk", "pt-x", monday),
                  *chart_record("pt-x", encounters=2, observations=3),
                  {"resourceType": "Observation", "id": "obs-y", "status": "final", "code": {"text": "Weight"},
                   "subject": {"reference": "Patient/pt-y"}, "valueQuantity": {"value": 70, "unit": "kg"}},
                  {"resourceType": "Observation", "id": "obs-z", "status": "final", "code": {"text": "Weight"},
                   "subject": {"reference": "Patient/pt-z"}, "valueQuantity": {"value": 80, "unit": "kg"}},
                  {"resourceType": "Observation", "id": "obs-foreign", "status": "final", "code": {"text": "Weight"},
                   "subject": {"reference": "https://other-ehr.example/fhir/R4/Patient/pt-x"}})
    install_application(world.app.id, org_id)
    ana = create_user(org_id, "ana@bulk.example", "Ana", "Lopez", "alopez", "1417000043")
    organization = Organization.get_by_id(org_id)
    from models.appointments import Snapshot, SnapshotAppointment
    from models.application import Authorization
    Authorization.create(application=world.app.id, user=ana.id)
    snapshot = Snapshot.create(organization=org_id, snapshot_date=dt.date.today(), status="complete",
                               completed_at=dt.datetime.utcnow())
    for n, pid in enumerate(("pt-x", "pt-y")):  # pt-z is on nobody's schedule: not exported
        SnapshotAppointment.create(snapshot=snapshot, ehr_appointment_id=f"a{n}", provider=ana.id, provider_npi=ana.npi,
                                   provider_name="Ana", start=monday, end=monday, status="booked", appointment_type="x",
                                   patient_id=pid, patient_first_name="P", patient_last_name="Q",
                                   patient_date_of_birth=dt.date(1970, 1, 1), patient_sex="female")
    client = BulkClient(f"{live}/fhir/r4/{organization.id}", mint_platform_token(runtime, live, ana, world.app, org_id))
    status, headers, body = client.kick_off("/Patient/$export", {"_type": "Patient,Observation,Encounter"})
    assert status == 202, body
    manifest = client.wait(headers["Content-Location"])
    files = {o["type"]: client.download(o["url"]) for o in manifest["output"]}
    assert sorted(p["id"] for p in files["Patient"]) == ["pt-x", "pt-y"]
    # What the FHIR API's own search answers for each patient, no more, no less.
    from helpers.fhir_api import Fhir, resources
    fhir = Fhir(live, org_id, client.token)
    for kind in ("Observation", "Encounter"):
        searched = [r for p in ("pt-x", "pt-y") for r in resources(fhir.search(kind, {"patient": p, "_count": 100}))]
        assert sorted(r["id"] for r in files[kind]) == sorted(r["id"] for r in searched), kind
    observations = files["Observation"]
    assert "obs-foreign" not in {o["id"] for o in observations} and "obs-y" in {o["id"] for o in observations}
    assert {o["subject"]["reference"] for o in observations} == {"Patient/pt-x", "Patient/pt-y"}
    assert len(files["Encounter"]) == 2
    text = json.dumps(files)
    assert fhir_ehr.origin not in text and "pt-z" not in text
    _validate([r for found in files.values() for r in found])
    # _since: the EHR's meta.lastUpdated decides (the newest Observation's instant keeps it, a ms later none).
    updated = sorted(dt.datetime.fromisoformat(o["meta"]["lastUpdated"].replace("Z", "+00:00")) for o in observations)
    for since, expected in ((updated[-1], len([u for u in updated if u >= updated[-1]])),
                            (updated[-1] + dt.timedelta(milliseconds=1), 0)):
        instant = since.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        status, headers, _ = client.kick_off("/Patient/$export", {"_type": "Observation", "_since": instant})
        assert status == 202
        assert sum(o["count"] for o in client.wait(headers["Content-Location"])["output"]) == expected >= 0
    assert expected == 0 and len(updated) > 1


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_an_export_the_ehr_left_unanswered_names_neither_the_ehrs_host_nor_its_retry(runtime, world, fhir_ehr, settings,
                                                                                    tmp_path):
    """A FHIR clinic's EHR down through every try: the export fails 503 with a generic message, as
    the FHIR API answers the same outage. Its OperationOutcome quoted the connector's error, "The
    EHR at {host:port} is unavailable (HTTP 503); the request will be retried.": the clinic's EHR
    host (which the FHIR API keeps to the log) and a retry that never comes."""
    from urllib.parse import urlsplit
    from helpers.fhir_ehr import appointment, connect_clinic, patient, practitioner
    from helpers.processes import free_port, settings_env, start_process, stop_process
    from models.application import Authorization
    from models.appointments import Snapshot, SnapshotAppointment
    port = free_port()
    live = f"http://127.0.0.1:{port}"  # as the `live` fixture's, its first try its last (SVC_TASK_MAX_RETRIES=0)
    proc = start_process(["serve", "--port", str(port)], settings_env(
        settings, SVC_ISSUER=live, SVC_PUBLIC_URL=live, SVC_TASK_MAX_RETRIES=0), port, log_path=tmp_path / "serve.log")
    try:
        org_id = connect_clinic(runtime.settings, fhir_ehr, f"{live}/ehr/jwks.json", name="Down FHIR Clinic")
        monday = dt.datetime(2026, 3, 2, 9, 0)
        fhir_ehr.seed(practitioner("pr-down", "1417000043", "Lopez", "Ana"),
                      patient("pt-d", "Doe", "Jane", "1970-01-02", "female"),
                      appointment("down-1", "pr-down", "pt-d", monday))
        install_application(world.app.id, org_id)
        ana = create_user(org_id, "ana@down.example", "Ana", "Lopez", "alopez", "1417000043")
        Authorization.create(application=world.app.id, user=ana.id)
        snapshot = Snapshot.create(organization=org_id, snapshot_date=dt.date.today(), status="complete",
                                   completed_at=dt.datetime.utcnow())
        SnapshotAppointment.create(snapshot=snapshot, ehr_appointment_id="a0", provider=ana.id, provider_npi=ana.npi,
                                   provider_name="Ana", start=monday, end=monday, status="booked",
                                   appointment_type="x", patient_id="pt-d", patient_first_name="P",
                                   patient_last_name="Q", patient_date_of_birth=dt.date(1970, 1, 1), patient_sex="female")
        client = BulkClient(f"{live}/fhir/r4/{org_id}", mint_platform_token(runtime, live, ana, world.app, org_id))
        fhir_ehr.fault(503, count=100_000, retry_after=0)
        try:
            status, headers, body = client.kick_off("/Patient/$export", {"_type": "Patient"})
            assert status == 202, body
            url = headers["Content-Location"]
            export_id = url.rsplit("/", 1)[1]
            wait_until(lambda: BulkExport.get_by_id(export_id).status != "pending", 60, "the export to fail")
        finally:
            fhir_ehr.fault(503, count=0)
        assert client.status(url)[0] == 202  # the first poll, always
        status, _, body = client.status(url)
    finally:
        stop_process(proc)
    assert status == 503 and outcome(body) == "exception", (status, body)
    said = body["issue"][0]["diagnostics"]
    assert urlsplit(fhir_ehr.base).netloc not in said and "retried" not in said, said
    assert "EHR" in said


def test_a_partners_backend_exports_with_a_key_pair_over_http(live, runtime, world):
    """The whole flow as a partner's backend runs it: its key pair, a signed assertion, a system
    token, the kick-off, polling, downloads (validated as R4) and DELETE; the local object store."""
    from helpers.bulk import Backend
    patients = schedule_patients(world.org, world.physician, world.app, 4)
    backend = Backend(runtime, live, world.org)
    client = backend.client(world.org.id)
    status, headers, body = client.kick_off("/Patient/$export")
    assert status == 202, body
    url = headers["Content-Location"]
    manifest = client.wait(url)
    kinds = [o["type"] for o in manifest["output"]]
    assert kinds[0] == "Patient" and {"Observation", "DocumentReference", "Condition", "Encounter"} <= set(kinds)
    assert len(kinds) == len(set(kinds))  # one file per type at this size
    everything = []
    for output in manifest["output"]:
        found = client.download(output["url"])
        assert len(found) == output["count"] and {r["resourceType"] for r in found} == {output["type"]}
        everything += found
    assert sorted(r["id"] for r in everything if r["resourceType"] == "Patient") == sorted(patients)
    _validate(everything)
    downloads = list(DisclosureRecord.select().where(DisclosureRecord.action == "bulk.download"))
    assert len(downloads) == len(kinds) and all(r.client_id == backend.app.client_id for r in downloads)
    assert set().union(*(set(r.patients) for r in downloads)) == set(patients)
    # A token narrower than the files: 403 on the types it does not cover; another backend's: 404.
    narrow = BulkClient(client.base, backend.token("system/Patient.rs"))
    by_type = {o["type"]: o["url"] for o in manifest["output"]}
    assert narrow.request("GET", by_type["Patient"])[0] == 200
    assert narrow.request("GET", by_type["Observation"])[0] == 403
    stranger = Backend(runtime, live, world.org, name="Stranger").client(world.org.id)
    assert stranger.status(url)[0] == 404 and stranger.request("GET", by_type["Patient"])[0] == 404
    # A clinic where the backend is not installed: 404.
    other, _ = clinic("Elsewhere", "https://ehr.example/elsewhere")
    assert BulkClient(f"{live}/fhir/r4/{other.id}", client.token).kick_off()[0] == 404
    assert client.request("DELETE", url)[0] == 202
    assert client.status(url)[0] == 404


def test_a_failed_export_answers_its_operation_outcome_and_expired_ones_are_gone(exporter, runtime, world):
    from bulk.build import mark_failed
    from models.directory import Organization
    client, _ = exporter
    Organization.update(ehr_url="https://ehr.example/test?outage=1").where(Organization.id == world.org.id).execute()
    status, headers, _ = client.kick_off(params={"_type": "Patient"})
    url = headers["Content-Location"]
    assert client.status(url)[0] == 202
    mark_failed(runtime, url.rsplit("/", 1)[1], "The clinic's EHR did not answer: down", 503)  # its retries used up
    status, headers, body = client.status(url)
    assert status == 503 and headers["Content-Type"].startswith("application/json") and outcome(body) == "exception"
    # Once expired, the status URL is a 404, and the next kick-off of the app deletes it.
    Organization.update(ehr_url="https://ehr.example/test").where(Organization.id == world.org.id).execute()
    BulkExport.update(expires_at=dt.datetime(2000, 1, 1)).execute()
    assert client.status(url)[0] == 404
    assert client.kick_off(params={"_type": "Patient"})[0] == 202
    assert BulkExport.select().count() == 1


def test_a_file_downloads_with_the_permission_that_exports_its_type(live, runtime, world):
    """An export is a search of each type (its kick-off needs `.s`), but a file downloaded with `.r`:
    a token granted read-by-id alone (`system/Observation.r`), refused the export, downloaded the
    whole clinic's Observations another token of the app had exported, and one granted search
    (`.s`) exported them but could not download them. Both now ask the same permission."""
    from helpers.bulk import Backend
    schedule_patients(world.org, world.physician, world.app, 3)
    backend = Backend(runtime, live, world.org)
    client = backend.client(world.org.id)
    status, headers, body = client.kick_off("/Patient/$export", {"_type": "Patient,Observation"})
    assert status == 202, body
    manifest = client.wait(headers["Content-Location"])
    assert [o["type"] for o in manifest["output"]] == ["Patient", "Observation"]
    read_only = BulkClient(client.base, backend.token("system/Patient.r system/Observation.r"))
    assert read_only.kick_off("/Patient/$export", {"_type": "Observation"})[0] == 403
    for output in manifest["output"]:
        status, _, raw = read_only.request("GET", output["url"])
        assert status == 403 and outcome(json.loads(raw)) == "forbidden", (output["type"], status, raw[:200])
    search_only = BulkClient(client.base, backend.token("system/Patient.s system/Observation.s"))
    assert all(search_only.download(o["url"]) for o in manifest["output"])
    status, headers, body = search_only.kick_off("/Patient/$export", {"_type": "Observation"})
    assert status == 202, body
    assert [search_only.download(o["url"]) for o in search_only.wait(headers["Content-Location"])["output"]]


def test_a_post_kickoff_takes_a_parameter_once_from_its_url_or_its_body(exporter):
    """A POST kick-off took its URL's parameters too, and the body's replaced them name by name: a
    `_since` in both was the body's, silently (the manifest's `request`, the URL, said the other),
    and a `patient` in the URL, refused on a GET, was taken. Now a parameter in both is a 400 naming
    it (never last-wins, as a repeat in one place), a URL `patient` the GET's 400; the rest combine."""
    client, patients = exporter
    body = {"resourceType": "Parameters", "parameter": [{"name": "_since", "valueInstant": "2020-01-01T00:00:00Z"}]}
    status, _, answer = client.kick_off("/Patient/$export?_since=2025-01-01T00:00:00Z", parameters=body)
    assert status == 400 and outcome(answer) == "invalid" and "_since" in answer["issue"][0]["diagnostics"], answer
    status, _, answer = client.kick_off(f"/Patient/$export?patient=Patient/{patients[0]}",
                                        parameters={"resourceType": "Parameters"})
    assert status == 400 and "patient" in answer["issue"][0]["diagnostics"], answer
    assert BulkExport.select().count() == 0
    status, headers, answer = client.kick_off("/Patient/$export?_type=Patient", parameters={
        "resourceType": "Parameters", "parameter": [{"name": "patient", "valueReference": {"reference": f"Patient/{patients[0]}"}}]})
    assert status == 202, answer
    files = [client.download(o["url"]) for o in client.wait(headers["Content-Location"])["output"]]
    assert [[r["id"] for r in found] for found in files] == [[patients[0]]]
