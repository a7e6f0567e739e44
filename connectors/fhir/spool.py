"""A FHIR patient's chart: R4 resources (US Core shapes) mapped to the chart's entries, and spooled.

`ChartSpool` takes the patient's resources in any order and mix of types (the pages of
`Patient/{id}/$everything`, or of searches by patient) and keeps them one page at a time: every
entry (problems, medications and allergies too: an EHR decides how many and how long they are)
appended to anonymous temporary files and read back line by line, as often as the PDF and the
JSON ask. So a chart of thousands of resources is read from the EHR once and memory stays
flat. A resource not about the patient (its `subject` names another, even one the patient
asserted, recorded or wrote) is left out, and so is one not in R4's shape (an
object where a string belongs, a string where an object does): counted in `malformed` per type,
which the chart's `omitted` names, and every field of an entry is text. No FHIR search syntax here (`connectors.fhir.query`).
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import tempfile

from connectors.base import Encounter
from connectors.compartment import about_patient
from connectors.matching import day_of
from models.ids import is_id

CHART_TYPES = ("Condition", "MedicationRequest", "AllergyIntolerance", "Encounter", "Observation", "DocumentReference")
"""The resource types a chart holds, in the order the search path reads them."""
STREAMED = ("problems", "medications", "allergies", "encounters", "observations", "documents")

log = logging.getLogger("svc_auth.connectors.fhir")


class ChartSpool:
    """The chart entries of one patient's resources, fed by `add`, streamed back by `read`."""

    def __init__(self, patient_id: str, base: str | None = None):
        self.patient_id = patient_id
        self.base = base  # the EHR's FHIR base: its absolute references are its own
        self.problems, self.medications, self.allergies = (Spooled(self, kind) for kind in STREAMED[:3])
        self.counts = dict.fromkeys(STREAMED, 0)
        self.left_out = 0
        self.malformed: dict[str, list[str]] = {}  # type -> ids of the resources not in R4's shape
        self._files = {kind: tempfile.TemporaryFile(prefix="svc-fhir-chart-") for kind in STREAMED}

    def add(self, resource: dict) -> None:
        kind = resource.get("resourceType")
        if kind not in CHART_TYPES:
            return  # the Patient itself, and what a chart does not show (Appointment, Practitioner, ...)
        if not self._of_patient(resource):
            self.left_out += 1
            return
        try:
            mapped = entry_of(kind, resource)
        except (AttributeError, TypeError, ValueError, KeyError, IndexError):
            self.malformed.setdefault(kind, []).append(resource["id"] if is_id(resource.get("id")) else "(none)")
            return
        if kind == "Condition":
            self._append("problems", mapped)
        elif kind == "MedicationRequest":
            self._append("medications", mapped)
        elif kind == "AllergyIntolerance":
            self._append("allergies", mapped)
        elif kind == "Encounter":
            if mapped.date is not None:  # a chart lists dated visits
                self._append("encounters", {**mapped.__dict__, "date": mapped.date.isoformat()})
        elif kind == "Observation":
            self._append("observations", mapped)
        else:
            self._append("documents", mapped)

    def omissions(self) -> list[dict]:
        """The chart's `omitted` entries for the resources left out as not in R4's shape."""
        return [{"resourceType": kind, "reason": (
            f"{len(ids)} {kind} resource(s) the EHR answered are not valid FHIR R4 and were left out "
            f"(ids: {', '.join(ids[:5])}{', ...' if len(ids) > 5 else ''})")[:500]}
            for kind, ids in self.malformed.items()]

    def read(self, kind: str):
        """The entries of `kind` (`STREAMED`) in the order added, one line at a time; several
        readers may interleave (each keeps its own position)."""
        spool, position = self._files[kind], 0
        while True:
            spool.seek(position)
            line = spool.readline()
            position = spool.tell()
            if not line:
                spool.seek(0, 2)  # back to the end for the next append
                return
            entry = json.loads(line)
            yield Encounter(**{**entry, "date": dt.date.fromisoformat(entry["date"])}) if kind == "encounters" else entry

    def close(self) -> None:
        for spool in self._files.values():
            spool.close()

    def _append(self, kind: str, entry: dict) -> None:
        self._files[kind].write(json.dumps(entry).encode() + b"\n")
        self.counts[kind] += 1

    def _of_patient(self, resource: dict) -> bool:
        """Whether the resource is about this patient: its `subject` (an AllergyIntolerance's
        `patient`) names them (`connectors.compartment.about_patient`: `Patient/{id}`, versioned,
        or absolute under this EHR's base; never another server's). Being in their compartment is
        not enough: `$everything` also answers what they asserted, recorded or wrote about others."""
        return about_patient(resource, self.patient_id, self.base)


class Spooled:
    """The spooled entries of one kind as a chart's list: sized, true when not empty, iterated from disk."""

    def __init__(self, spool: ChartSpool, kind: str):
        self.spool, self.kind = spool, kind

    def __len__(self) -> int:
        return self.spool.counts[self.kind]

    def __iter__(self):
        return self.spool.read(self.kind)


def problem_of(condition: dict) -> dict:
    coding = next(iter((condition.get("code") or {}).get("coding") or ()), {})
    return {"id": condition.get("id"), "code": coding.get("code", ""), "description": text_of(condition.get("code")),
            "onset": day_of(condition)}


def medication_of(request: dict) -> dict:
    dosage = next(iter(request.get("dosageInstruction") or ()), {})
    dose = next(iter(dosage.get("doseAndRate") or ()), {}).get("doseQuantity") or {}
    return {"id": request.get("id"), "name": text_of(request.get("medicationCodeableConcept"))
            or (request.get("medicationReference") or {}).get("display", ""),
            "dose": f"{dose.get('value', '')} {dose.get('unit', '')}".strip() or dosage.get("text", ""),
            "frequency": dosage.get("text", "") if dose else (dosage.get("patientInstruction") or ""),
            "started": day_of(request), "status": request.get("status", "")}


def allergy_of(allergy: dict) -> dict:
    reaction = next(iter(allergy.get("reaction") or ()), {})
    manifestation = next(iter(reaction.get("manifestation") or ()), None)
    return {"id": allergy.get("id"), "substance": text_of(allergy.get("code")), "reaction": text_of(manifestation),
            "severity": reaction.get("severity") or allergy.get("criticality") or ""}


def encounter_of(encounter: dict) -> Encounter:
    provider = next(((p.get("individual") or {}).get("display", "") for p in encounter.get("participant") or ()), "")
    kind = text_of(next(iter(encounter.get("type") or ()), None)) or (encounter.get("class") or {}).get("display", "")
    return Encounter(date=_date(day_of(encounter)), encounter_type=_text(kind), provider=_text(provider),
                     reason=text_of(next(iter(encounter.get("reasonCode") or ()), None)),
                     vitals={}, assessment="", plan="", id=str(encounter.get("id") or ""))


def observation_of(observation: dict) -> dict:
    """A vital sign or lab result: its value and unit as text (components joined, e.g. a blood
    pressure `120/80` `mm[Hg]`), or why it is absent."""
    value, unit = _value(observation)
    if not value and not observation.get("component"):
        value = f"({text_of(observation.get('dataAbsentReason'))})" if observation.get("dataAbsentReason") else ""
    elif not value:
        parts = [(_value(c), text_of(c.get("code"))) for c in observation["component"]]
        units = {u for (_, u), _ in parts}
        if len(units) == 1:
            value, unit = "/".join(v for (v, _), _ in parts), units.pop()
        else:
            value = "; ".join(f"{name} {v} {u}".strip() for (v, u), name in parts)
    coding = next(iter((observation.get("code") or {}).get("coding") or ()), {})
    return {"id": observation.get("id"), "date": day_of(observation),
            "category": text_of(next(iter(observation.get("category") or ()), None)), "code": coding.get("code", ""),
            "name": text_of(observation.get("code")), "value": value, "unit": unit,
            "interpretation": text_of(next(iter(observation.get("interpretation") or ()), None))}


def document_of(reference: dict) -> dict:
    """What a DocumentReference is (title, date, type), never its content (no `data`, no `url`)."""
    attachment = next((c.get("attachment") or {} for c in reference.get("content") or ()), {})
    return {"id": reference.get("id"), "date": day_of(reference),
            "title": attachment.get("title") or reference.get("description") or text_of(reference.get("type")),
            "type": text_of(reference.get("type")), "category": text_of(next(iter(reference.get("category") or ()), None)),
            "status": reference.get("status", ""), "content_type": attachment.get("contentType", "")}


def entry_of(kind: str, resource: dict):
    """The chart entry of a resource of `kind` (`CHART_TYPES`); AttributeError, TypeError... for one
    not in R4's shape."""
    if kind == "Encounter":
        return encounter_of(resource)
    mapper = {"Condition": problem_of, "MedicationRequest": medication_of, "AllergyIntolerance": allergy_of,
              "Observation": observation_of, "DocumentReference": document_of}[kind]
    return _texts(mapper(resource))


def text_of(concept) -> str:
    """A CodeableConcept's text, else its first coding's display, else its code (the first of
    them that is a string: the schedule's mapping calls this too, and passes over the rest)."""
    if not isinstance(concept, dict):
        return ""
    coding = next(iter(concept.get("coding") or ()), {})
    return next((value for value in (concept.get("text"), coding.get("display"), coding.get("code"))
                 if isinstance(value, str) and value), "")


def _text(value) -> str:
    """A string element as text; anything else (an EHR's object, list or number there) is malformed."""
    if value is None or isinstance(value, str):
        return value or ""
    raise TypeError(f"a string element is a {type(value).__name__}")


def _texts(entry: dict) -> dict:
    """A chart entry whose every field is text (what the PDF and the JSON schema expect)."""
    return {name: _text(value) if name != "id" else (None if value is None else str(value)) for name, value in entry.items()}


def _value(element: dict) -> tuple[str, str]:
    """(value, unit) of an Observation's or a component's `value[x]` ("" when none)."""
    if "valueQuantity" in element:
        quantity = element["valueQuantity"] or {}
        return _number(quantity.get("value")), str(quantity.get("unit") or quantity.get("code") or "")
    if "valueCodeableConcept" in element:
        return text_of(element["valueCodeableConcept"]), ""
    if "valueBoolean" in element:
        return ("true" if element["valueBoolean"] else "false"), ""
    for key in ("valueString", "valueInteger", "valueDateTime", "valueTime"):
        if key in element:
            return _number(element[key]), ""
    if "valueRange" in element:
        low, high = (element["valueRange"].get(end) or {} for end in ("low", "high"))
        return f"{_number(low.get('value'))}-{_number(high.get('value'))}", str(low.get("unit") or high.get("unit") or "")
    return "", ""


def _number(value) -> str:
    """A FHIR decimal or integer as written (the JSON's own text for 7.1, 120 or 98.0)."""
    return "" if value is None else str(value)


def _date(text: str) -> dt.date | None:
    try:
        return dt.date.fromisoformat(text) if len(text) == 10 else None
    except ValueError:
        return None
