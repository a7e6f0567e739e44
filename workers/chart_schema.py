"""The JSON Schema (draft 2020-12) of the chart ZIP's JSON: one shape for every EHR, served at
`GET /v1/schemas/chart.json` (`CHART_SCHEMA_JSON`, built once at import; a text constant).

Every entry has its EHR `id` (the FHIR resource id: the sandbox's FHIR API serves the same ids).
Vital signs are observations (category "Vital Signs"), never fields of an encounter. Dates are
`YYYY-MM-DD`, or "" when the EHR gives none. `omitted`, when present, names the resource types
the EHR refused for this chart and why.
"""
from __future__ import annotations

import json
from types import MappingProxyType

DAY = r"^(\d{4}-\d{2}-\d{2})?$"


def _entry(what: str, /, **fields) -> dict:
    """An object with exactly these string fields (all required)."""
    return {"type": "object", "description": what, "additionalProperties": False,
            "required": list(fields), "properties": {name: {"type": "string", **extra}
                                                     for name, extra in fields.items()}}


def _day(description: str) -> dict:
    return {"pattern": DAY, "description": description}


def chart_schema() -> dict:
    """The schema as a fresh dict."""
    text = {}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "svc-auth chart",
        "description": "The JSON file of a chart retrieval ZIP (`{request_id}.json`), whatever the clinic's EHR.",
        "type": "object",
        "additionalProperties": False,
        "required": ["request_id", "organization", "patient", "problems", "medications", "allergies",
                     "encounters", "observations", "documents"],
        "properties": {
            "request_id": {"type": "string", "description": "the chart retrieval request"},
            "organization": {"type": "string", "description": "the clinic's name"},
            "patient": _entry("the patient", id=text, first_name=text, last_name=text,
                              date_of_birth={"pattern": r"^\d{4}-\d{2}-\d{2}$"},
                              sex={"enum": ["female", "male", "other", "unknown"]}),
            "problems": {"type": "array", "items": _entry(
                "a problem-list Condition", id=text, code=text, description=text,
                onset=_day("onset, else recorded date"))},
            "medications": {"type": "array", "items": _entry(
                "a MedicationRequest", id=text, name=text, dose=text, frequency=text,
                started=_day("authored on"), status={"description": "the FHIR MedicationRequest status"})},
            "allergies": {"type": "array", "items": _entry(
                "an AllergyIntolerance", id=text, substance=text, reaction=text, severity=text)},
            "encounters": {"type": "array", "items": _entry(
                "a dated Encounter (its vital signs are in `observations`)", id=text,
                date={"pattern": r"^\d{4}-\d{2}-\d{2}$"}, type=text, provider=text, reason=text, assessment=text,
                plan=text)},
            "observations": {"type": "array", "items": _entry(
                "an Observation: a vital sign (category `Vital Signs`) or a lab result", id=text,
                date=_day("effective, else issued"), category=text, code={"description": "its first coding's code (LOINC)"},
                name=text, value={"description": "as text; a blood pressure is `systolic/diastolic`"}, unit=text,
                interpretation=text)},
            "documents": {"type": "array", "items": _entry(
                "what a DocumentReference is (never its content)", id=text, date=_day("the document's date"),
                title=text, type=text, category=text, status=text, content_type=text)},
            "omitted": {"type": "array", "description": "resource types the EHR refused for this chart, or whose resources it answered in a shape that is not R4's (those are left out), and why",
                        "items": _entry("a refused type", resourceType=text, reason=text)},
        },
    }


CHART_SCHEMA_JSON = json.dumps(chart_schema(), indent=1)
"""The schema as served."""
ENTRY_FIELDS = MappingProxyType({name: tuple(spec["items"]["properties"])
                                 for name, spec in chart_schema()["properties"].items() if spec.get("type") == "array"})
"""The fields of each list's entries, in order (what `workers.chart_archive` writes)."""


def entry(kind: str, values: dict) -> dict:
    """An entry of list `kind` in the schema's shape: its fields in order, each a string ("" when absent)."""
    return {name: "" if values.get(name) is None else str(values.get(name)) for name in ENTRY_FIELDS[kind]}
