"""Change versions: one counter per cached topic, bumped by whatever changes that topic."""
from __future__ import annotations

import peewee

from models.db import BaseModel


class ChangeVersion(BaseModel):
    """`topic` (e.g. `applications`, `signing_keys`) and how often it changed. Processes poll this
    table (and listen on Redis when configured) to drop what they cached."""

    topic = peewee.CharField(primary_key=True, max_length=64)
    version = peewee.BigIntegerField(default=0)
