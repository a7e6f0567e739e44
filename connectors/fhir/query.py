"""The neutral `ResourceQuery` as this EHR's FHIR search parameters: the only place that knows
FHIR search syntax."""
from __future__ import annotations

import datetime as dt
from types import MappingProxyType

from connectors.base import Criterion, ResourceQuery
from connectors.compartment import in_patient_compartment
from models.fhir_grammar import is_resource_type
from models.ids import R4_ID, is_id
from models.npi import NPI_SYSTEM

TOKEN_VALUE = R4_ID  # an identifier value (R4 id characters): no `,` (OR) nor `|` (system)
SEARCH_DATE = MappingProxyType({"Appointment": "date", "Encounter": "date", "Observation": "date",
                                "Condition": "onset-date", "MedicationRequest": "authoredon",
                                "AllergyIntolerance": "date", "DocumentReference": "date"})
"""The search parameter of each type's date (a `ResourceQuery`'s start/end)."""
PATIENT_SEARCH = "patient"
"""How a type of the patient compartment (`connectors.compartment`) is searched for one patient
(every such type has R4's `patient` parameter); Patient itself by `_id`."""
PRACTITIONER_SEARCH = frozenset(("Appointment", "Encounter"))
PAGE_SIZE = 100


def search_params(query: ResourceQuery) -> dict | None:
    """The FHIR search parameters of a `ResourceQuery`, or None when nothing can match it (an
    invalid id, or a field that does not apply to the type)."""
    kind = query.resource_type
    if not is_resource_type(kind):
        return None
    ids, narrowed = set(query.ids), bool(query.ids)
    for own, value in (("Patient", query.patient), ("Practitioner", query.practitioner)):
        if value is not None and kind == own:  # the patient (practitioner) itself
            ids, narrowed = (ids & {value}) if narrowed else {value}, True
    if narrowed and (not ids or not all(is_id(i) for i in ids)):
        return None
    params = {"_id": ",".join(sorted(ids))} if ids else {}
    if query.patient is not None and kind != "Patient":
        if not in_patient_compartment(kind) or not is_id(query.patient):
            return None
        params[PATIENT_SEARCH] = f"Patient/{query.patient}"
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
    for criterion in query.criteria:
        value = criterion_value(criterion)
        if value is None or criterion.name in params:
            return None
        params[criterion.name] = value
    return params


def _escaped(value: str) -> str:
    """A search value with FHIR's reserved characters (`\\ , |`) escaped (R4 3.1.1.4.6)."""
    for char in ("\\", ",", "|"):
        value = value.replace(char, "\\" + char)
    return value


def criterion_value(criterion: Criterion):
    """The value(s) of a neutral `Criterion` as the FHIR search parameter of the same name takes
    them (a list: the parameter repeated), or None when it cannot be written."""
    if criterion.kind == "date":
        (start, end), = criterion.values
        return ([f"ge{moment(start)}"] if start else []) + ([f"lt{moment(end)}"] if end else []) or None
    if criterion.kind == "token":
        return ",".join(f"{_escaped(system)}|{_escaped(code)}" if system else _escaped(code)
                        for system, code in criterion.values)
    if criterion.kind == "string":
        return ",".join(_escaped(text) for text in criterion.values)
    if criterion.kind == "reference":
        if not all(is_id(ident) and (kind is None or is_resource_type(kind)) for kind, ident in criterion.values):
            return None
        return ",".join(f"{kind}/{ident}" if kind else ident for kind, ident in criterion.values)
    return None


def moment(value: dt.datetime) -> str:
    """A bound of a date search: a day at midnight as the day (a date element compares as one),
    else an instant."""
    return value.date().isoformat() if value.time() == dt.time() else instant(value)


def instant(moment: dt.datetime) -> str:
    """A naive UTC datetime as a FHIR instant."""
    return moment.replace(microsecond=0).isoformat() + "Z"
