"""An accounting of disclosures (HIPAA 164.528): the records of one clinic, filtered, as JSON
objects, CSV rows, or a FHIR Bundle of AuditEvents in IHE BALP shape (PatientRead, PatientQuery).

Reading it is itself audited (`audit.read` in the configuration audit), by `read_accounting`.
"""
from __future__ import annotations

import base64
import csv
import functools
import io
import operator
import uuid

import peewee

from audit.chain import iso_ms
from models.audit import AuditEvent
from models.disclosures import CHECKPOINT, DisclosureRecord
from models.ids import fhir_id, id_spellings
from ops.csvcells import text_row

FIELDS = ("seq", "at", "action", "outcome", "status", "application_id", "client_id", "user_id", "organization_id",
          "patients", "resource_type", "resource_ids", "query", "jti", "scope", "source_address", "request_id")

BALP = "https://profiles.ihe.net/ITI/BALP/StructureDefinition/"
DCM = "http://dicom.nema.org/resources/ontology/DCM"
RESTFUL = "http://terminology.hl7.org/CodeSystem/restful-interaction"
AUDIT_EVENT_TYPE = "http://terminology.hl7.org/CodeSystem/audit-event-type"
OBJECT_ROLE = "http://terminology.hl7.org/CodeSystem/object-role"
PARTICIPATION = "http://terminology.hl7.org/CodeSystem/v3-ParticipationType"
BALP_CODES = "https://profiles.ihe.net/ITI/BALP/CodeSystem/BasicAuditEntityType"


def record_json(row: DisclosureRecord) -> dict:
    value = {name: getattr(row, name) for name in FIELDS}
    value["at"] = iso_ms(row.at)
    return value


def disclosures(organization_id: str, patient: str | None = None, application_id: str | None = None,
                user_id: str | None = None, start=None, end=None) -> list[dict]:
    """The clinic's records, oldest first; `start` inclusive, `end` exclusive (naive UTC). A
    `patient` is found under each of its spellings (`models.ids.id_spellings`): records are
    append-only, so those written before issue 35 keep `pat_…` where newer ones have `pat-…`."""
    query = (DisclosureRecord.select().where((DisclosureRecord.organization_id == organization_id)
                                             & (DisclosureRecord.action != CHECKPOINT))
             .order_by(DisclosureRecord.seq))
    spellings = id_spellings(patient) if patient else ()
    if spellings:
        # A LIKE narrows (checked exactly below); the pattern is given as a Value the JSON field does
        # not convert (a plain string without `_` or `%` went through JSONText and matched nothing).
        narrowed = [DisclosureRecord.patients.contains(peewee.Value(f'"{s}"', converter=False)) for s in spellings]
        query = query.where(functools.reduce(operator.or_, narrowed))
    if application_id:
        query = query.where(DisclosureRecord.application_id == application_id)
    if user_id:
        query = query.where(DisclosureRecord.user_id == user_id)
    if start is not None:
        query = query.where(DisclosureRecord.at >= start)
    if end is not None:
        query = query.where(DisclosureRecord.at < end)
    return [record_json(row) for row in query.iterator() if not spellings or set(spellings) & set(row.patients)]


def read_accounting(actor: str, filters: dict, output: str, **query) -> list[dict]:
    """`disclosures(**query)`, and its reading recorded in the configuration audit (`audit.read`)."""
    records = disclosures(**query)
    AuditEvent.record(actor, "audit.read", query.get("organization_id") or "", format=output, records=len(records),
                      **{name: value for name, value in filters.items() if value is not None})
    return records


def as_csv(records: list[dict]) -> str:
    """One header row, then one row per record; lists are `;`-joined; no cell a formula (`ops.csvcells`)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(FIELDS)
    for record in records:
        writer.writerow(text_row(";".join(v) if isinstance(v, list) else v for v in (record[name] for name in FIELDS)))
    return out.getvalue()


def _coding(system: str, code: str, display: str | None = None) -> dict:
    return {"system": system, "code": code, **({"display": display} if display else {})}


def audit_event(record: dict, issuer: str) -> dict:
    """One record as an AuditEvent (IHE BALP: PatientRead for a read, PatientQuery for the rest)."""
    read = record["action"] in ("read", "chart.url", "chart.download")
    profile = "IHE.BasicAudit.PatientRead" if read else "IHE.BasicAudit.PatientQuery"
    ok = record["outcome"] == "success"
    agents = [{
        "type": {"coding": [_coding(DCM, "110153", "Source Role ID")]},
        "who": {"identifier": {"system": f"{issuer}/clients", "value": record["client_id"] or "svc-auth"}},
        "requestor": record["user_id"] is None,
        "network": {"address": record["source_address"], "type": "2"} if record["source_address"] else None,
        "policy": [f"urn:ietf:params:oauth:jti:{record['jti']}"] if record["jti"] else None,
    }, {
        "type": {"coding": [_coding(DCM, "110152", "Destination Role ID")]},
        "who": {"display": "svc-auth", "identifier": {"system": "urn:ietf:rfc:3986", "value": issuer}},
        "requestor": False,
    }]
    if record["user_id"]:
        agents.append({"type": {"coding": [_coding(PARTICIPATION, "IRCP", "information recipient")]},
                       "who": {"identifier": {"system": f"{issuer}/users", "value": record["user_id"]}},
                       "requestor": True,
                       "policy": [f"urn:ietf:params:oauth:jti:{record['jti']}"] if record["jti"] else None})
    # References in R4's id spelling: a record written before issue 35 keeps `pat_…`, its export says `pat-…`.
    entities = [{"what": {"reference": f"Patient/{fhir_id(p)}"}, "type": _coding("http://hl7.org/fhir/resource-types", "Patient"),
                 "role": _coding(OBJECT_ROLE, "1", "Patient")} for p in record["patients"]]
    entities += [{"what": {"reference": f"{record['resource_type']}/{fhir_id(i)}"},
                  "type": _coding("http://hl7.org/fhir/resource-types", record["resource_type"]),
                  "role": _coding(OBJECT_ROLE, "4", "Domain Resource")} for i in record["resource_ids"]
                 if record["resource_type"] and record["resource_type"] != "Patient"]
    if not read:
        entities.append({"type": _coding(OBJECT_ROLE, "24", "Query"), "role": _coding(OBJECT_ROLE, "24", "Query"),
                         "query": _b64(f"{record['resource_type']}?{record['query']}"),
                         "description": record["action"]})
    if record["request_id"]:
        entities.append({"what": {"identifier": {"value": record["request_id"]}},
                         "type": _coding(BALP_CODES, "XrequestId", "X-Request-Id")})
    event = {
        "resourceType": "AuditEvent",
        "id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{issuer}/disclosures/{record['seq']}")),
        "meta": {"profile": [BALP + profile]},
        "type": _coding(AUDIT_EVENT_TYPE, "rest", "Restful Operation"),
        "subtype": [_coding(RESTFUL, "read" if read else "search-type"), _coding("urn:svc-auth:disclosure", record["action"])],
        "action": "R" if read else "E",
        "recorded": record["at"],
        "outcome": "0" if ok else ("4" if record["status"] and record["status"] < 500 else "8"),
        "outcomeDesc": f"HTTP {record['status']}" if record["status"] is not None else record["outcome"],
        "agent": [_clean(agent) for agent in agents],
        "source": {"observer": {"display": "svc-auth", "identifier": {"value": issuer}},
                   "type": [_coding("http://terminology.hl7.org/CodeSystem/security-source-type", "4",
                                    "Application Server")]},
        "entity": entities,
    }
    return event


def _b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def _clean(value: dict) -> dict:
    return {k: v for k, v in value.items() if v is not None}


def as_fhir_bundle(records: list[dict], issuer: str) -> dict:
    """The records as a `collection` Bundle of AuditEvents (no `total`: R4's bdl-1 keeps it to
    searchset and history Bundles)."""
    return {"resourceType": "Bundle", "type": "collection",
            "entry": [{"fullUrl": f"urn:uuid:{event['id']}", "resource": event}
                      for event in (audit_event(r, issuer) for r in records)]}
