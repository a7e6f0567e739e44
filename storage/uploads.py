"""What a killed writer can leave in an object store, as the recovery sweep sees it."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass


@dataclass(frozen=True)
class UnfinishedUpload:
    """Something a writer left: `key` is the object it was writing (None when unknown, as for an
    old staging object), `started` when (naive UTC), `handle` what `abort_upload` needs."""

    key: str | None
    started: dt.datetime
    handle: tuple
