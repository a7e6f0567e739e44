"""Reading request parameters the same way for JSON and form bodies and query strings."""
from __future__ import annotations

from oauth.errors import invalid_request


def text_param(params: dict, name: str, required: bool = True, max_length: int = 2000) -> str | None:
    """A string parameter: missing/empty -> None (or invalid_request when required)."""
    value = params.get(name)
    if value is None or value == "":
        if required:
            raise invalid_request(f"The {name} parameter is required.")
        return None
    if not isinstance(value, str):
        raise invalid_request(f"The {name} parameter must be a string.")
    if len(value) > max_length:
        raise invalid_request(f"The {name} parameter is too long.")
    return value
