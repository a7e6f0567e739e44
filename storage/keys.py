"""Object keys: what a store accepts as a name (shared by the local and the S3 store)."""
from __future__ import annotations

import re

KEY = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*")  # matched whole: `$` lets a final newline by


def check_key(key: str) -> str:
    """Object keys are relative slash-separated names without `..` or leading dots."""
    if not isinstance(key, str) or len(key) > 300 or not KEY.fullmatch(key):
        raise ValueError(f"invalid object key {key!r}")
    return key
