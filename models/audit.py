"""Audit trail: who changed what, when (activation, secrets, keys)."""
from __future__ import annotations

import peewee

from models.db import BaseModel, JSONText, wall_now


class AuditEvent(BaseModel):
    at = peewee.DateTimeField(default=wall_now, index=True)
    actor = peewee.CharField(max_length=200)
    action = peewee.CharField(max_length=100)
    subject = peewee.CharField(max_length=200, default="")
    detail = JSONText(default=dict)

    @classmethod
    def record(cls, actor: str, action: str, subject: str = "", **detail) -> "AuditEvent":
        return cls.create(actor=actor, action=action, subject=subject, detail=detail)
