"""The sandbox EHR (`ehr: sandbox`): synthetic clinics for development and tests, nothing stored.

- `connector.py`: the generator (patients, schedules, charts) and `SandboxConnector`;
- `fhir.py`: its FHIR side (`read_resource`, `search_resources` over the generator);
- `render.py`: its data as FHIR R4 JSON in US Core shapes, the one place that renders resources;
- `rendered.py`: the per-process memory of a patient's rendered resources (keyed on the date too).
"""
from __future__ import annotations

from connectors.sandbox.connector import PANEL_SIZE, SandboxConnector, connect, patient_panel  # noqa: F401
