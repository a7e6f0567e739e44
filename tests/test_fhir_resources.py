"""The FHIR connector's reads for the platform FHIR API (`read_resource`, `search_resources`) and
its charts' memory, in process, against a real FHIR server (Medplum's FHIR engine, run open: the
token path is tested in test_fhir_connector.py)."""
from __future__ import annotations

import datetime as dt
import io
import json
import tracemalloc
import urllib.request

import pypdf
import pytest
import pyzipper

from connectors import ConnectorError, Criterion, ResourceNotFound, ResourceQuery, connector_for
from connectors.fhir.connector import fhir_state
from lifecycle.organizations import create_organization
from workers.chart_archive import write_chart_zip

from helpers.fhir_ehr import appointment, chart_record, patient, practitioner, start_fhir_ehr

pytestmark = pytest.mark.slow

NOON = dt.datetime(2026, 3, 2, 12, 0)


@pytest.fixture(scope="module")
def open_ehr():
    ehr = start_fhir_ehr("--open")
    yield ehr
    ehr.proc.terminate()
    ehr.proc.wait(timeout=10)


@pytest.fixture
def connector(runtime, open_ehr):
    open_ehr.admin("reset", {})
    organization = create_organization("Open FHIR Clinic", "fhir", open_ehr.base, fhir_auth="none")
    return connector_for(runtime, organization)


def seed_schedule(ehr) -> None:
    ehr.seed(practitioner("pr-ana", "1417000001", "Lopez", "Ana"), practitioner("pr-ben", "1417000019", "Okafor", "Ben"),
             patient("pt-1", "Doe", "Jane", "1970-01-02", "female"), patient("pt-2", "Roe", "Rick", "1955-06-30", "male"),
             *[appointment(f"ana-{n:03d}", "pr-ana", f"pt-{1 + n % 2}", NOON + dt.timedelta(hours=n)) for n in range(130)],
             appointment("ben-1", "pr-ben", "pt-1", NOON + dt.timedelta(hours=1)),
             *chart_record("pt-1", encounters=3, observations=5))


def ids(resources) -> list[str]:
    return [r["id"] for r in resources]


def test_read_resource_reads_the_ehrs_resource_and_says_not_found_for_anything_else(connector, open_ehr):
    seed_schedule(open_ehr)
    jane = connector.read_resource("Patient", "pt-1")
    assert jane["resourceType"] == "Patient" and jane["id"] == "pt-1" and jane["birthDate"] == "1970-01-02"
    assert connector.read_resource("Observation", "obs-a1c")["valueQuantity"] == {"value": 7.1, "unit": "%"}
    assert connector.read_resource("Practitioner", "pr-ana")["identifier"][0]["value"] == "1417000001"
    with pytest.raises(ResourceNotFound):
        connector.read_resource("Patient", "pt-404")
    with pytest.raises(ResourceNotFound):   # an id of another type
        connector.read_resource("Encounter", "pt-1")
    request = urllib.request.Request(f"{open_ehr.base}/Patient/pt-2", method="DELETE")
    urllib.request.urlopen(request, timeout=10).close()
    with pytest.raises(ResourceNotFound):   # deleted: 410 Gone
        connector.read_resource("Patient", "pt-2")

    asked = open_ehr.stats()["fhir"]
    for kind, hostile in (("Patient", "../Practitioner/pr-ana"), ("Patient", "pt-1\n"), ("Patient", "pt-1?_id=pt-2"),
                          ("Patient", "pt 1"), ("Patient", "x" * 65), ("Patient", ""), ("Patient", "pt-1%00"),
                          ("patient", "pt-1"), ("Patient/pt-1", "x"), ("../metadata", "x"), ("Patient\x00", "pt-1")):
        with pytest.raises(ResourceNotFound):
            connector.read_resource(kind, hostile)
    assert open_ehr.stats()["fhir"] == asked   # none of them reached the EHR


def test_search_resources_translates_the_neutral_query_and_pages_lazily(connector, open_ehr):
    seed_schedule(open_ehr)
    day = dt.timedelta(days=1)
    everything = ids(connector.search_resources(ResourceQuery("Appointment", practitioner="pr-ana")))
    assert sorted(everything) == [f"ana-{n:03d}" for n in range(130)]      # two pages of 100, no Patients

    # Lazily: the first matches cost one page; the second page is read only when reached.
    before = open_ehr.stats()["pages"].get("Appointment", 0)
    first = list(zip(range(5), connector.search_resources(ResourceQuery("Appointment", practitioner="pr-ana"))))
    assert len(first) == 5 and open_ehr.stats()["pages"]["Appointment"] == before + 1
    assert ids(connector.search_resources(ResourceQuery("Appointment", practitioner="pr-ana", offset=120))) \
        == everything[120:]                                                  # the same order, from the offset

    window = ResourceQuery("Appointment", practitioner="pr-ana", start=NOON + day, end=NOON + 2 * day)
    assert sorted(ids(connector.search_resources(window))) == [f"ana-{n:03d}" for n in range(24, 48)]
    early = ResourceQuery("Appointment", patient="pt-1", end=NOON + dt.timedelta(hours=3))
    assert sorted(ids(connector.search_resources(early))) == ["ana-000", "ana-002", "ben-1"]
    assert ids(connector.search_resources(ResourceQuery("Practitioner", npi="1417000019"))) == ["pr-ben"]
    assert ids(connector.search_resources(ResourceQuery("Practitioner", practitioner="pr-ana"))) == ["pr-ana"]
    assert ids(connector.search_resources(ResourceQuery("Patient", patient="pt-2"))) == ["pt-2"]
    assert sorted(ids(connector.search_resources(ResourceQuery("Patient", ids=("pt-1", "pt-2", "pt-9"))))) \
        == ["pt-1", "pt-2"]
    assert sorted(ids(connector.search_resources(ResourceQuery("Encounter", patient="pt-1")))) \
        == ["enc-000", "enc-001", "enc-002"]
    hours = ResourceQuery("Observation", patient="pt-1", start=dt.datetime(2024, 1, 1, 1), end=dt.datetime(2024, 1, 1, 3))
    assert sorted(ids(connector.search_resources(hours))) == ["obs-0001", "obs-0002"]
    assert ids(connector.search_resources(ResourceQuery("Observation", patient="someone-else"))) == ["obs-other"]
    assert sorted(ids(connector.search_resources(ResourceQuery("Condition", patient="pt-1", start=dt.datetime(2020, 1, 1))))) \
        == ["cond-dm"]                                                       # onset-date

    # Nothing can match: no request reaches the EHR.
    asked = open_ehr.stats()["fhir"]
    for query in (ResourceQuery("Patient", patient="pt-1", ids=("pt-2",)), ResourceQuery("Patient", ids=("pt-1,pt-2",)),
                  ResourceQuery("Practitioner", npi="1417000001,1417000019"), ResourceQuery("Practitioner", npi="x|y"),
                  ResourceQuery("Practitioner", patient="pt-1"), ResourceQuery("Practitioner", start=NOON),
                  ResourceQuery("Encounter", patient="../pt-1"), ResourceQuery("Appointment", practitioner="pr ana"),
                  ResourceQuery("Observation", npi="1417000001"), ResourceQuery("patient"), ResourceQuery("Patient/x")):
        assert list(connector.search_resources(query)) == [], query
    assert open_ehr.stats()["fhir"] == asked


def test_a_chart_of_thousands_of_observations_streams_page_by_page_with_flat_memory(runtime, connector, open_ehr,
                                                                                      tmp_path):
    count = 3000
    record = chart_record("pt-big", encounters=20, observations=count, documents=40)
    open_ehr.seed(patient("pt-big", "Big", "Chart", "1960-05-05", "male"), *record)
    tracemalloc.start()
    try:
        held = json.loads(json.dumps(record))  # what holding the patient's resources would take
        holding, _ = tracemalloc.get_traced_memory()
        del held
        tracemalloc.reset_peak()
        baseline, _ = tracemalloc.get_traced_memory()
        chart = connector.fetch_chart("pt-big")
        archive = write_chart_zip(chart, "req_big", "pw", str(tmp_path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Read once, 100 a page: 3066 resources of the compartment (the other patient's are not in it).
    assert open_ehr.stats()["pages"] == {"Patient/$everything": 31}
    # Never the whole chart in memory: a page of resources at a time (and fpdf2's ~70 pages).
    assert peak - baseline < holding / 4, (peak - baseline, holding)
    with pyzipper.AESZipFile(archive) as opened:
        opened.setpassword(b"pw")
        data = json.loads(opened.read("req_big.json"))
        pdf = pypdf.PdfReader(io.BytesIO(opened.read("req_big.pdf")))
    assert len(data["observations"]) == count + 2 and len(data["documents"]) == 40 and len(data["encounters"]) == 20
    assert [o["id"] for o in data["observations"]][-3:] == ["obs-2997", "obs-2998", "obs-2999"]
    last = pdf.pages[len(pdf.pages) - 2].extract_text() + pdf.pages[-1].extract_text()
    assert "Heart rate: 99 /min" in last and "Discharge summary 39" in last


def test_an_everything_listed_but_refused_falls_back_to_searches_and_is_remembered(runtime, connector, open_ehr):
    open_ehr.seed(patient("pt-1", "Doe", "Jane", "1970-01-02", "female"),
                  *chart_record("pt-1", encounters=3, observations=2, documents=1))
    open_ehr.offer_everything("listed")      # in the CapabilityStatement, yet 400 not-supported when called
    chart = connector.fetch_chart("pt-1")
    assert [e.id for e in chart.encounters()] == ["enc-000", "enc-001", "enc-002"]
    assert sorted(o["id"] for o in chart.observations()) == ["obs-0000", "obs-0001", "obs-a1c", "obs-bp"]
    assert [d["id"] for d in chart.documents()] == ["doc-0"] and len(chart.problems) == 2
    assert fhir_state(runtime).capabilities.get(open_ehr.base) is False
    searched = open_ehr.stats()["pages"]
    assert "Patient/$everything" not in searched and searched["Observation"] == 1
    asked = open_ehr.stats()["fhir"]
    connector.fetch_chart("pt-1")            # remembered: no metadata, no $everything, the 7 reads
    assert open_ehr.stats()["fhir"] == asked + 7 and open_ehr.stats()["metadata"] == 1


def test_a_failed_search_records_the_patient_it_asked_for(runtime, connector, open_ehr):
    """An `ehr.fetch` failure names the patient of `patient=Patient/X` (and of `Patient/X` reads):
    the compartment's parameters, not a regex over the URL (which missed `patient=`)."""
    open_ehr.seed(patient("pt-1", "Doe", "Jane", "1970-01-02", "female"), *chart_record("pt-1", encounters=1))
    records = []
    connector.recorder = lambda outcome, kind, ids, patients, query: records.append((outcome, kind, list(patients)))
    open_ehr.fault(400, 2)    # refused: not retried
    with pytest.raises(ConnectorError):
        list(connector.search_resources(ResourceQuery("Encounter", patient="pt-1")))
    with pytest.raises(ConnectorError):
        connector.read_resource("Patient", "pt-1")
    assert records == [("failure", "Encounter", ["pt-1"]), ("failure", "Patient", ["pt-1"])]
    assert [r["id"] for r in connector.search_resources(ResourceQuery("Encounter", patient="pt-1"))] == ["enc-000"]
    assert records[-1] == ("success", "Encounter", ["pt-1"])


def test_an_ehr_refusing_a_searchs_parameters_is_asked_again_without_them(connector, open_ehr):
    """The EHR narrows by each served parameter (`code=system|code`); one that refuses the search
    (400) is asked again without them: the FHIR API's matcher narrows what comes back."""
    seed_schedule(open_ehr)
    a1c = ResourceQuery("Observation", patient="pt-1", criteria=(Criterion("code", "token", (("http://loinc.org", "4548-4"),)),))
    assert ids(connector.search_resources(a1c)) == ["obs-a1c"]
    every = sorted(ids(connector.search_resources(ResourceQuery("Observation", patient="pt-1"))))
    assert len(every) > 1
    open_ehr.fault(400, 1)
    assert sorted(ids(connector.search_resources(a1c))) == every
    assert open_ehr.stats()["faults"] >= 1
