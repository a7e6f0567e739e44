"""Token search on codings (`code`, `category`): `[system]|code` or `code`, a comma meaning OR.

Applied by the API to what the connector found (any connector, no connector change): a resource
matches when one of its codings in that element matches one of the values.
"""
from __future__ import annotations

from fhir_api.outcome import invalid

TOKEN_PARAMS = ("code", "category")
MAX_VALUES = 20


def token_filters(args: dict[str, list[str]]) -> tuple[tuple[str, tuple[tuple[str | None, str], ...]], ...]:
    """(element, ((system or None, code), ...)) per token parameter given."""
    filters = []
    for name in TOKEN_PARAMS:
        if name not in args:
            continue
        values = []
        for item in args[name][0].split(","):
            system, bar, code = item.rpartition("|")
            if not code:
                raise invalid(f"{name} must be [system|]code[,[system|]code...].")
            values.append((system if bar and system else None, code))
        if len(values) > MAX_VALUES:
            raise invalid(f"{name} takes at most {MAX_VALUES} values.")
        filters.append((name, tuple(values)))
    return tuple(filters)


def _codings(resource: dict, element: str) -> list[dict]:
    value = resource.get(element)
    concepts = value if isinstance(value, list) else [value] if isinstance(value, dict) else []
    return [c for concept in concepts if isinstance(concept, dict) for c in concept.get("coding") or ()
            if isinstance(c, dict)]


def matches(resource: dict, filters) -> bool:
    """Does `resource` match every filter?"""
    for element, values in filters:
        codings = _codings(resource, element)
        if not any(c.get("code") == code and (system is None or c.get("system") == system)
                   for c in codings for system, code in values):
            return False
    return True
