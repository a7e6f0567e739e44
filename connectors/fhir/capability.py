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
