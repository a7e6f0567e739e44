"""Test mode: organization `123456789` answers a fixed, de-identified appointment set.

Generated in code from a fixed seed (no data file): the same 120 appointments (three pages of
50, 50 and 20) for every caller. Days and times are fixed offsets from the current UTC day so
the set always looks like "the coming 10 days"; everything else never changes.
"""
from __future__ import annotations

import datetime as dt
import functools
import random

from models.clock import utc_iso

TEST_ORGANIZATION_ID = "123456789"
TEST_APPOINTMENT_COUNT = 120

_FIRST = ("Alex", "Sam", "Jordan", "Taylor", "Morgan", "Casey", "Riley", "Jamie", "Avery", "Quinn", "Drew", "Robin")
_LAST = ("Testpatient", "Sample", "Example", "Demo", "Placeholder", "Fictional", "Synthetic", "Mock")
_PROVIDERS = (("usr_test_provider_1", "1234567893", "Dr. Test Provider One"),
              ("usr_test_provider_2", "1245319599", "Dr. Test Provider Two"),
              ("usr_test_provider_3", "1679576722", "Dr. Test Provider Three"))
_TYPES = (("office_visit", "Follow-up visit"), ("new_patient", "New patient consultation"),
          ("annual_physical", "Annual physical"), ("telehealth", "Medication review"),
          ("procedure", "Minor procedure"))
_LOCATIONS = ("Test Clinic Room 1", "Test Clinic Room 2", "Telehealth")
_STATUSES = ("booked", "booked", "booked", "pending", "arrived")  # FHIR AppointmentStatus codes


@functools.lru_cache(maxsize=1)
def _template() -> tuple:
    """(day offset, minutes after 08:00, duration, fields) for each appointment, in page order."""
    rng = random.Random(123456789)
    items = []
    for n in range(TEST_APPOINTMENT_COUNT):
        day = 1 + (n * 10) // TEST_APPOINTMENT_COUNT
        slot = (n % 12) * 40 + rng.randrange(0, 4) * 5
        duration = rng.choice([15, 20, 30, 45])
        kind, reason = rng.choice(_TYPES)
        provider = _PROVIDERS[n % len(_PROVIDERS)]
        born = dt.date(1940, 1, 1) + dt.timedelta(days=rng.randrange(0, 365 * 80))
        items.append((day, slot, duration, {
            "id": f"test-appt-{n + 1:04d}", "status": rng.choice(_STATUSES), "appointment_type": kind,
            "reason": reason, "location": rng.choice(_LOCATIONS),
            "provider": {"user_id": provider[0], "npi": provider[1], "name": provider[2]},
            "patient": {"id": f"test-patient-{rng.randrange(1, 90):03d}", "first_name": rng.choice(_FIRST),
                        "last_name": rng.choice(_LAST), "date_of_birth": born.isoformat(),
                        "sex": rng.choice(["female", "male"])},
        }))
    items.sort(key=lambda item: (item[0], item[1], item[3]["id"]))
    return tuple(items)


def appointments_page(today: dt.date, offset: int, limit: int) -> dict:
    midnight = dt.datetime.combine(today, dt.time(8, 0))
    page = []
    for day, slot, duration, fields in _template()[offset:offset + limit]:
        start = midnight + dt.timedelta(days=day, minutes=slot)
        page.append({"id": fields["id"], "start": utc_iso(start),
                     "end": utc_iso(start + dt.timedelta(minutes=duration)),
                     **{k: v for k, v in fields.items() if k != "id"}})
    return {"appointments": page, "offset": offset, "limit": limit, "total": TEST_APPOINTMENT_COUNT,
            "snapshot_date": today.isoformat()}
