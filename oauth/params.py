"""Reading request parameters the same way for JSON and form bodies and query strings.

`check_fields` is the one validation every request's input passes (BaseHandler runs it on query
strings, forms and JSON bodies; client authentication on Basic credentials): text must be storable
and printable everywhere (PostgreSQL refuses NUL; a lone surrogate cannot be encoded as UTF-8), and
JSON is at most `MAX_JSON_DEPTH` levels deep (deeper input is an attack, not data)."""
from __future__ import annotations

import re

from oauth.errors import invalid_request

MAX_JSON_DEPTH = 32
_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")


def check_text(name: str, value: str) -> None:
    """400 naming the field when `value` holds a NUL character or a lone surrogate."""
    match = _BAD_TEXT.search(value)
    if match:
        what = "a NUL character" if match.group() == "\x00" else "an unpaired surrogate (not valid Unicode)"
        raise invalid_request(f"The {_printable(name)} field contains {what}.")


def _printable(name: str) -> str:
    return _BAD_TEXT.sub("?", name)[:100]


def check_fields(value, path: str = "") -> None:
    """Walk a parsed body (dicts, lists, strings) without recursion: bounded depth, clean text."""
    if type(value) is dict and all(type(item) is str for item in value.values()) \
            and not _BAD_TEXT.search("".join(value) + "".join(value.values())):
        return  # a flat object of clean text (a form, a query): one scan, nothing to name
    stack = [(value, path, 1)]
    while stack:
        item, where, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise invalid_request(f"The JSON body is nested more than {MAX_JSON_DEPTH} levels deep.")
        if isinstance(item, str):
            check_text(where or "body", item)
        elif isinstance(item, dict):
            for key, child in item.items():
                check_text(f"{where}.{key}" if where else key, key)
                stack.append((child, f"{where}.{_printable(key)}" if where else _printable(key), depth + 1))
        elif isinstance(item, list):
            for index, child in enumerate(item):
                stack.append((child, f"{where}[{index}]", depth + 1))


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
    check_text(name, value)
    return value
