"""Compact JSON bytes, as `json.JSONEncoder(separators=(",", ":"))` writes them, made by orjson
where the two are known to agree.

orjson writes a flat object (text, integers, booleans, None) in a tenth of the encoder's time and,
while its output is ASCII without DEL, byte for byte what the encoder writes (the same escapes of
`"`, `\\` and control characters). The encoder (ensure_ascii) escapes DEL and every code point past
it as `\\uXXXX` where orjson writes UTF-8, and spells some floats differently, so anything else goes to the
encoder: token claims and responses keep their exact bytes (tests/test_keys.py)."""
from __future__ import annotations

import json

import orjson

_ENCODER = json.JSONEncoder(separators=(",", ":"))
_FLAT = frozenset({str, int, bool, type(None)})


def compact_json(value) -> bytes:
    """`value` as the encoder's compact JSON, in bytes (ASCII)."""
    if type(value) is dict and _FLAT.issuperset(map(type, value.values())):
        try:
            data = orjson.dumps(value)
        except TypeError:  # an integer past 64 bits, a non-text key, a lone surrogate: the encoder decides
            data = None
        if data is not None and data.isascii() and b"\x7f" not in data:  # the encoder escapes DEL too
            return data
    return _ENCODER.encode(value).encode("ascii")


_IN_SCRIPT = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def script_json(value) -> str:
    """`value` as JSON to put inside an HTML `<script type="application/json">` element: `<`, `>`
    and `&` escaped, so no value (an app's name `<!--<script>`, `</script>`) can change how the
    HTML parser reads the element; `JSON.parse` reads the same value back."""
    return json.dumps(value).translate(_IN_SCRIPT)
