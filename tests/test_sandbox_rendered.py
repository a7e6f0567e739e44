"""The sandbox's per-process memory of rendered resources (`connectors.sandbox.rendered`, issue 35
item 6): the same answers as rendering every time, the EHR's call still made (and recorded, and
failing in an outage) on every request, rendered anew when the runtime's clock reaches the next day,
and bounded."""
from __future__ import annotations

import pytest

from connectors import ConnectorUnavailable, ResourceQuery
from connectors.sandbox.connector import SandboxConnector, patient_panel
from connectors.sandbox.fhir import CHART_KINDS
from connectors.sandbox.rendered import RenderedResources
from models.clock import Clock

ORG = "org_rendered0test"


def _search(connector: SandboxConnector, kind: str, patient: str) -> list[dict]:
    return list(connector.search_resources(ResourceQuery(kind, patient=patient, count=1000)))


def test_the_memory_answers_what_rendering_every_time_answers_and_renders_once():
    memory, clock = RenderedResources(), Clock()
    kept = SandboxConnector(ORG, "Clinic", clock=clock, rendered=memory)
    fresh = SandboxConnector(ORG, "Clinic", clock=clock)
    patient = patient_panel(ORG)[7].id
    for kind, _ in CHART_KINDS:
        first = _search(kept, kind, patient)
        assert first == _search(fresh, kind, patient), kind
        again = _search(kept, kind, patient)
        assert again == first and all(a is b for a, b in zip(again, first)), kind  # the same objects: kept
        for resource in first:
            assert kept.read_resource(kind, resource["id"]) == fresh.read_resource(kind, resource["id"])
    assert len(memory) >= len(CHART_KINDS) - 1  # a kind the patient has none of is kept too (empty)


def test_the_next_day_renders_anew():
    memory, clock = RenderedResources(), Clock()
    connector = SandboxConnector(ORG, "Clinic", clock=clock, rendered=memory)
    patient = patient_panel(ORG)[2].id
    today = _search(connector, "Observation", patient)
    held = len(memory)
    clock.advance(86400)
    tomorrow = _search(connector, "Observation", patient)
    assert len(memory) == held + 1
    assert tomorrow == today and tomorrow[0] is not today[0]


def test_every_request_still_calls_and_records_the_ehr():
    memory = RenderedResources()
    calls = []
    connector = SandboxConnector(ORG, "Clinic", clock=Clock(), rendered=memory)
    connector.recorder = lambda outcome, kind, ids, patients, query: calls.append((outcome, kind, tuple(patients)))
    patient = patient_panel(ORG)[4].id
    for _ in range(3):
        assert _search(connector, "Condition", patient)
    assert calls == [("success", "Patient", (patient,))] * 3
    down = SandboxConnector(ORG, "Clinic", "https://ehr.example/x?outage=1", clock=Clock(), rendered=memory)
    with pytest.raises(ConnectorUnavailable):
        _search(down, "Condition", patient)
    assert _search(connector, "Condition", "pat-" + "0" * 16) == []  # no such patient: nothing kept, nothing found


def test_the_memory_is_bounded_least_recently_used_first():
    memory = RenderedResources(max_resources=10)
    renders = []

    def render(n):
        renders.append(n)
        return [{"n": n}] * 4
    for n in range(3):
        memory.get(("k", n), lambda: render(n))
    assert len(memory) == 2 and renders == [0, 1, 2]  # 12 > 10: the oldest went
    memory.get(("k", 1), lambda: render(1))           # kept: not rendered again, now the most recent
    memory.get(("k", 0), lambda: render(0))           # gone: rendered again, pushes out ("k", 2)
    memory.get(("k", 1), lambda: render(1))
    assert renders == [0, 1, 2, 0]
    assert memory.get(("big",), lambda: [{}] * 11) and len(memory) == 2  # larger than the bound: not kept
