"""What a clinic's CapabilityStatement (`GET {iss}/metadata`) declares of Bulk Data (docs/bulk-data.md)."""
from __future__ import annotations

BULK_DATA = "http://hl7.org/fhir/uv/bulkdata/CapabilityStatement/bulk-data"
EXPORT = "http://hl7.org/fhir/uv/bulkdata/OperationDefinition/export"
PATIENT_EXPORT = "http://hl7.org/fhir/uv/bulkdata/OperationDefinition/patient-export"
GROUP_EXPORT = "http://hl7.org/fhir/uv/bulkdata/OperationDefinition/group-export"


def with_bulk_data(statement: dict) -> dict:
    """`statement` (the FHIR API's) also instantiating the Bulk Data CapabilityStatement, with the
    `export` operation, Patient's `patient-export`, and Group (read, search by `_id`) with `group-export`."""
    statement["instantiates"] = list(statement.get("instantiates") or ()) + [BULK_DATA]
    for rest in statement.get("rest") or ():
        rest["operation"] = list(rest.get("operation") or ()) + [{"name": "export", "definition": EXPORT}]
        resources = rest.setdefault("resource", [])
        for resource in resources:
            if resource.get("type") == "Patient":
                resource["operation"] = list(resource.get("operation") or ()) + [
                    {"name": "patient-export", "definition": PATIENT_EXPORT}]
        resources.append({"type": "Group", "interaction": [{"code": "read"}, {"code": "search-type"}],
                          "searchParam": [{"name": "_id", "type": "token"}],
                          "operation": [{"name": "group-export", "definition": GROUP_EXPORT}]})
    return statement
