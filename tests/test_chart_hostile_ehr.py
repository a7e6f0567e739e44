"""Chart builds against a hostile EHR (tests/helpers/hostile_ehr.py) by a real `svc-auth worker`
process: whatever the EHR's data, a chart request ends (`ready` or `failed` with a reason) within
bounded time and memory, and the archive holds what the EHR said."""
from __future__ import annotations

import json
import re

import pytest

from helpers.charts import open_archive
from helpers.hostile_ehr import LARGE_PAGES, LONG_WORD
from helpers.processes import wait_until
from lifecycle.applications import install_application
from models.charts import ChartRequest
from workers.chart_archive import PDF_MAX_TEXT
from workers.charts import enqueue_chart_build

pytestmark = [pytest.mark.slow, pytest.mark.svc_settings(workers=True, task_max_retries=1, task_min_backoff_ms=100,
                                                         task_max_backoff_ms=300, ehr_batch_deadline=10)]

BUILD_SECONDS = 45  # a small chart's build on a busy 2-core machine, worker start included
CHART_DEADLINE = 8          # SVC_CHART_BUILD_DEADLINE in the slow EHR's test
MEMORY_GROWTH = 120 * 2**20  # a worker's peak memory grows less than this building a chart of ~80 MB of problems


@pytest.fixture
def hostile_chart_clinic(runtime, world, cli, hostile):
    """The hostile EHR as an open FHIR clinic (`--fhir-auth none`) with the app installed: its id."""
    hostile.calm()
    done = cli("orgs", "create", "--name", "Hostile Clinic", "--ehr", "fhir", "--fhir-base-url", hostile.base,
               "--fhir-auth", "none", "--json")
    org_id = json.loads(done.stdout)["id"]
    install_application(world.app.id, org_id)
    return org_id


def built(runtime, world, org_id) -> ChartRequest:
    """A chart request of the EHR's patient, queued, once a worker has ended it."""
    request = ChartRequest.create(application=world.app.id, organization=org_id, patient_id="pt-1")
    enqueue_chart_build(runtime, request.id)
    return wait_until(lambda: (found := ChartRequest.get_by_id(request.id)).status != "pending" and found,
                      timeout=BUILD_SECONDS, what="the chart build")


def built_archive(runtime, world, org_id):
    """`built`, ready: (the request, its archive's PDF text, its JSON chart)."""
    done = built(runtime, world, org_id)
    assert (done.status, done.error) == ("ready", None)
    handle, _ = runtime.object_store.open_object(done.object_key)
    with handle:
        text, chart = open_archive(handle.read(), done.id, world.app.id)
    return done, text, chart


def test_a_text_without_spaces_is_charted_in_seconds_and_whole_in_the_json(runtime, world, hostile, hostile_chart_clinic,
                                                                           start_worker):
    """A Condition whose text is one 60,000-character word: the PDF's line wrapping cut such a word
    in time cubic in its length (6,000 characters took 27 s; this one, hours), so the worker sat on
    the build, renewing its lease, and the request stayed `pending` for good. The PDF now shows the
    first PDF_MAX_TEXT characters and says the JSON holds the rest; the JSON holds all of it."""
    hostile.attack("long-text", on="Condition")
    start_worker()
    done, text, chart = built_archive(runtime, world, hostile_chart_clinic)
    assert [p["description"] for p in chart["problems"]] == [LONG_WORD]
    flat = re.sub(r"Patient chart [0-9a-f]+ - page \d+", "", text.replace("\n", ""))  # without page footers
    shown = re.search(r"(Asthmax+) \[\.\.\. ([\d,]+) more characters: the JSON ?file in this archive holds the ?"
                      r"whole text\]", flat)  # (a line break between two words leaves no space)
    assert shown and PDF_MAX_TEXT - 10 < len(shown[1]) <= PDF_MAX_TEXT, flat[flat.index("Medications") - 300:]
    assert len(shown[1]) + int(shown[2].replace(",", "")) == len(LONG_WORD)


def test_a_resource_not_in_r4_s_shape_is_left_out_and_named_and_the_chart_is_built(runtime, world, hostile,
                                                                                   hostile_chart_clinic, start_worker):
    """Conditions whose `code` is a string, whose `coding` holds a string or is one:
    the mapping raised AttributeError, the task was retried (the whole chart read from the EHR
    again each time) and the request ended `failed` with "could not be built", for one bad
    resource. The chart is now built from the valid ones, and its `omitted` names the rest."""
    hostile.attack("malformed", on="Condition")
    start_worker()
    done, text, chart = built_archive(runtime, world, hostile_chart_clinic)
    assert [(p["id"], p["description"]) for p in chart["problems"]] == [("cond-1", "Asthma")]
    assert chart["omitted"] == [{"resourceType": "Condition", "reason": (
        "3 Condition resource(s) the EHR answered are not valid FHIR R4 and were left out "
        "(ids: cond-2, cond-3, cond-4)")}]
    assert "not valid FHIR R4" in text.replace("\n", " ")


def peak_rss(pid: int) -> int:
    """A live process's peak resident memory so far (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as status:
        return int(next(line for line in status if line.startswith("VmHWM:")).split()[1]) * 1024


def test_problems_as_many_and_long_as_the_ehr_likes_stay_on_disk(runtime, world, hostile, hostile_chart_clinic,
                                                                 start_worker):
    """80 Conditions of ~1 MB of text each (10 pages): problems, medications and allergies were kept
    in memory ("a chart has tens"), and the JSON was written from one string of them all, so the
    worker's memory grew by several times the EHR's answers: an EHR could exhaust it. They are now
    spooled to disk like encounters and written to the JSON one by one (the PDF lists PDF_MAX_LIST
    of each and PDF_MAX_TEXT characters of a text)."""
    worker = start_worker()
    assert built(runtime, world, hostile_chart_clinic).status == "ready"  # warm: every module loaded
    before = peak_rss(worker.pid)
    hostile.attack("large-problems", on="Condition")
    done, _, chart = built_archive(runtime, world, hostile_chart_clinic)
    growth = peak_rss(worker.pid) - before
    assert len(chart["problems"]) == LARGE_PAGES * 8 and len(chart["problems"][-1]["description"]) > 1_000_000
    assert growth < MEMORY_GROWTH, f"the worker's peak memory grew by {growth / 2**20:.0f} MiB"


@pytest.mark.svc_settings(workers=True, task_max_retries=1, task_min_backoff_ms=100, task_max_backoff_ms=300,
                          ehr_batch_deadline=10, chart_build_deadline=CHART_DEADLINE)
def test_an_ehr_paging_slowly_for_ever_fails_the_chart_at_its_build_deadline(runtime, world, hostile,
                                                                             hostile_chart_clinic, start_worker):
    """Every page a second, each linking a new next page: each request was within its deadline, a
    search ran to its 1,000 pages (1,000 s), and a chart has six of them, so the request stayed
    `pending` (its lease renewed) for hours. The build's requests together now have
    SVC_CHART_BUILD_DEADLINE: the request fails, saying so."""
    hostile.attack("slow-endless", on="Condition")
    start_worker()
    done = built(runtime, world, hostile_chart_clinic)
    assert done.status == "failed" and f"within its deadline ({CHART_DEADLINE} s)" in done.error, done.error
