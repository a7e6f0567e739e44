"""CSV cells a spreadsheet opens as text: a cell that begins with `=`, `+`, `-`, `@`, a tab or a
carriage return is a formula to Excel, LibreOffice and Google Sheets (`=HYPERLINK(...)` sends the
reader's data away), so such a cell is written with a leading `'`, which they show as text (OWASP,
"CSV Injection"). Values partners or EHRs choose (a clinic's name, a search, an id) reach our CSVs."""
from __future__ import annotations

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def as_text_cell(value) -> str:
    """`value` as a CSV cell no spreadsheet runs (None: empty)."""
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def text_row(values) -> list[str]:
    return [as_text_cell(v) for v in values]
