"""The neutral `ResourceQuery` as this EHR's FHIR search parameters: the only place that knows
FHIR search syntax."""
from __future__ import annotations

import datetime as dt
import re
from types import MappingProxyType

from connectors.base import ResourceQuery
from models.ids import R4_ID, is_id
from models.npi import NPI_SYSTEM

RESOURCE_TYPE = re.compile(r"[A-Z][A-Za-z]{1,63}")
TOKEN_VALUE = R4_ID  # an identifier value (R4 id characters): no `,` (OR) nor `|` (system)
SEARCH_DATE = MappingProxyType({"Appointment": "date", "Encounter": "date", "Observation": "date",
                                "Condition": "onset-date", "MedicationRequest": "authoredon",
                                "AllergyIntolerance": "date", "DocumentReference": "date"})
"""The search parameter of each type's date (a `ResourceQuery`'s start/end)."""
PATIENT_SEARCH = frozenset(("Appointment", "Encounter", "Condition", "Observation", "MedicationRequest",
                            "AllergyIntolerance", "DocumentReference"))
"""Types searched by `patient`; Patient itself by `_id`."""
PRACTITIONER_SEARCH = frozenset(("Appointment", "Encounter"))
PAGE_SIZE = 100


def search_params(query: ResourceQuery) -> dict | None:
    """The FHIR search parameters of a `ResourceQuery`, or None when nothing can match it (an
    invalid id, or a field that does not apply to the type)."""
    kind = query.resource_type
    if not RESOURCE_TYPE.fullmatch(kind or ""):
        return None
    ids, narrowed = set(query.ids), bool(query.ids)
    for own, value in (("Patient", query.patient), ("Practitioner", query.practitioner)):
        if value is not None and kind == own:  # the patient (practitioner) itself
            ids, narrowed = (ids & {value}) if narrowed else {value}, True
    if narrowed and (not ids or not all(is_id(i) for i in ids)):
        return None
    params = {"_id": ",".join(sorted(ids))} if ids else {}
    if query.patient is not None and kind != "Patient":
        if kind not in PATIENT_SEARCH or not is_id(query.patient):
            return None
        params["patient"] = f"Patient/{query.patient}"
    if query.practitioner is not None and kind != "Practitioner":
        if kind not in PRACTITIONER_SEARCH or not is_id(query.practitioner):
            return None
        params["practitioner"] = f"Practitioner/{query.practitioner}"
    if query.npi is not None:
        if kind != "Practitioner" or not TOKEN_VALUE.fullmatch(query.npi):
            return None
        params["identifier"] = f"{NPI_SYSTEM}|{query.npi}"
    if query.start is not None or query.end is not None:
        if kind not in SEARCH_DATE:
            return None
        params[SEARCH_DATE[kind]] = ([f"ge{instant(query.start)}"] if query.start else []) + \
            ([f"lt{instant(query.end)}"] if query.end else [])
    return params


def instant(moment: dt.datetime) -> str:
    """A naive UTC datetime as a FHIR instant."""
    return moment.replace(microsecond=0).isoformat() + "Z"
