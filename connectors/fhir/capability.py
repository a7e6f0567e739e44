"""What an EHR's CapabilityStatement says it offers."""
from __future__ import annotations


def offers_patient_everything(statement) -> bool:
    """Whether a CapabilityStatement offers Patient `$everything`: an operation named `everything`
    on Patient (or defined by the standard Patient-everything OperationDefinition)."""
    if not isinstance(statement, dict) or statement.get("resourceType") != "CapabilityStatement":
        return False

    def everything(operation) -> bool:
        return isinstance(operation, dict) and (operation.get("name") in ("everything", "$everything") or str(
            operation.get("definition") or "").endswith("/OperationDefinition/Patient-everything"))

    for rest in statement.get("rest") or ():
        if not isinstance(rest, dict) or rest.get("mode", "server") != "server":
            continue
        for resource in rest.get("resource") or ():
            if isinstance(resource, dict) and resource.get("type") == "Patient" and any(
                    map(everything, resource.get("operation") or ())):
                return True
    return False


def ehr_types(statement) -> dict | None:
    """What an EHR's CapabilityStatement lists: {type: sorted search parameter names, or None when it
    lists none for the type}; None when there is no CapabilityStatement to read."""
    if not isinstance(statement, dict) or statement.get("resourceType") != "CapabilityStatement":
        return None
    found: dict = {}
    for rest in statement.get("rest") or ():
        if not isinstance(rest, dict) or rest.get("mode", "server") != "server":
            continue
        for resource in rest.get("resource") or ():
            kind = resource.get("type") if isinstance(resource, dict) else None
            if not isinstance(kind, str):
                continue
            params = [p.get("name") for p in resource.get("searchParam") or () if isinstance(p, dict)]
            names = sorted({n for n in params if isinstance(n, str)})
            found[kind] = sorted(set(found.get(kind) or ()) | set(names)) if (names or found.get(kind)) else None
    return found


BULK_DATA_STATEMENT = "http://hl7.org/fhir/uv/bulkdata/CapabilityStatement/bulk-data"
BULK_OPERATIONS = ("export", "patient-export", "group-export")


def offers_bulk_export(statement) -> bool:
    """Whether a CapabilityStatement offers FHIR Bulk Data export (Bulk Data Access IG 2.0.0,
    "Server Capability Documentation"): it `instantiates` the Bulk Data CapabilityStatement, or
    declares an `export`, `patient-export` or `group-export` operation (on the server or a type),
    or one defined by the IG's OperationDefinitions. svc-auth calls only `Patient/$export`."""
    if not isinstance(statement, dict) or statement.get("resourceType") != "CapabilityStatement":
        return False
    instantiates = statement.get("instantiates")
    if isinstance(instantiates, list) and any(str(u).split("|")[0] == BULK_DATA_STATEMENT for u in instantiates):
        return True

    def export(operation) -> bool:
        if not isinstance(operation, dict):
            return False
        name = str(operation.get("name") or "").lstrip("$")
        definition = str(operation.get("definition") or "").split("|")[0]
        return name in BULK_OPERATIONS or any(definition.endswith(f"/OperationDefinition/{n}") for n in BULK_OPERATIONS)

    for rest in statement.get("rest") or ():
        if not isinstance(rest, dict) or rest.get("mode", "server") != "server":
            continue
        if any(map(export, rest.get("operation") or ())):
            return True
        for resource in rest.get("resource") or ():
            if isinstance(resource, dict) and resource.get("type") in ("Patient", "Group") and any(
                    map(export, resource.get("operation") or ())):
                return True
    return False
