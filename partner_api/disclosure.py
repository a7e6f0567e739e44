"""What the partner REST API's answers disclose (audit/): appointment pages and charts."""
from __future__ import annotations

import dataclasses

from audit.disclosures import Disclosure, unique
from models.application import Application
from models.ids import fhir_id, is_id
from models.charts import ChartRequest
from connectors.sandbox import patient_panel
from workers.charts import TEST_ORGANIZATION, TEST_REQUEST_ID


def describe_page(page: dict):
    """An appointment page: the patients it names, its appointments' ids."""
    rows = page.get("appointments") or ()
    return unique((row.get("patient") or {}).get("id") for row in rows), [row.get("id") for row in rows]


def chart_request_patient(body: dict) -> str | None:
    """The patient a chart request names, as the request records it (R4's spelling: `models.ids.fhir_id`);
    None when it is no id (the request is refused: a failure record names no junk)."""
    value = body.get("patient_id")
    return fhir_id(value) if is_id(value) else None


def describe_chart_request(answer: dict, patient_id: str):
    return [patient_id], [answer.get("request_id")]


def chart_of(application_id: str | None, request_id: str) -> tuple[str | None, str | None, str | None]:
    """(organization id, patient id, application id) of a chart request (the test-mode one too)."""
    if request_id == TEST_REQUEST_ID:
        return TEST_ORGANIZATION, patient_panel(TEST_ORGANIZATION)[0].id, application_id
    if not is_id(request_id):  # NUL, overlong, slashes: no request has such an id (and no query is made)
        return None, None, application_id
    query = ChartRequest.select().where(ChartRequest.id == request_id)
    if application_id is not None:
        query = query.where(ChartRequest.application == application_id)
    request = query.first()
    if request is None:
        return None, None, application_id
    return request.organization_id, request.patient_id, request.application_id


def download_disclosure(request: Disclosure, key: str) -> Disclosure:
    """A ZIP download's disclosure: the chart request whose ZIP is object `key` (the test-mode
    ZIP: the test clinic's patient, no application), its app and client id; no user, no token."""
    chart = None if "\x00" in key or len(key) > 1024 else (
        ChartRequest.select().where(ChartRequest.object_key == key).first())
    if chart is not None:
        app = Application.get_or_none(Application.id == chart.application_id)
        return dataclasses.replace(request, organization_id=chart.organization_id, application_id=chart.application_id,
                                   client_id=app.client_id if app else None, resource_type="ChartRequest",
                                   resource_ids=(chart.id,), patients=(chart.patient_id,))
    if key.endswith(f"/{TEST_REQUEST_ID}.zip"):
        return dataclasses.replace(request, organization_id=TEST_ORGANIZATION, resource_type="ChartRequest",
                                   resource_ids=(TEST_REQUEST_ID,), patients=(patient_panel(TEST_ORGANIZATION)[0].id,))
    return dataclasses.replace(request, resource_type="ChartRequest")
