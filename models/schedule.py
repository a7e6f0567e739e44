"""Runs of scheduled jobs: one row per job and date, so a night is claimed by one scheduler only."""
from __future__ import annotations

import peewee

from models.db import BaseModel, wall_now


class ScheduledRun(BaseModel):
    job = peewee.CharField(max_length=64)
    run_date = peewee.DateField()
    claimed_at = peewee.DateTimeField(default=wall_now)
    claimed_by = peewee.CharField(max_length=200, default="")

    class Meta:
        indexes = ((("job", "run_date"), True),)

    @classmethod
    def claim(cls, job: str, run_date, claimed_by: str = "", claimed_at=None) -> bool:
        """True for exactly one caller per (job, date), however many schedulers race for it."""
        try:
            with cls._meta.database.atomic():
                cls.create(job=job, run_date=run_date, claimed_by=claimed_by[:200], claimed_at=claimed_at or wall_now())
            return True
        except peewee.IntegrityError:
            return False
