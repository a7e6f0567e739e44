"""What an SIU message says (CONTRACTS.md, "Schedules pushed by the EHR: an HL7v2 SIU feed").

`header(message)` reads MSH (who sent it, what it is); `appointment(message, header, zone)` reads
the one appointment every listed trigger carries whole. Each raises `Refused` with the
acknowledgment code (`AR`: not accepted; `AE`: accepted but cannot be applied) and why, in words
that never quote patient data.
"""
from __future__ import annotations

from types import MappingProxyType

import datetime as dt
from dataclasses import dataclass, fields

from hl7feed.message import CLOCK_SKEW, BadTime, Message, parse_date, parse_dtm
from models.npi import is_npi

TRIGGERS = ("S12", "S13", "S14", "S15", "S17", "S26")
VERSIONS = ("2.3", "2.3.1", "2.4", "2.5", "2.5.1")
NPI_OID = "2.16.840.1.113883.4.6"
STATUSES = MappingProxyType({"booked": "booked", "pending": "pending", "waitlist": "waitlist", "complete": "fulfilled",
            "cancelled": "cancelled", "noshow": "noshow", "deleted": "entered-in-error"})
"""SCH-25 (filler status, any case) -> FHIR AppointmentStatus."""
TRIGGER_STATUS = MappingProxyType({"S15": "cancelled", "S26": "noshow"})
SEXES = MappingProxyType({"F": "female", "M": "male", "O": "other", "U": "unknown"})
UNITS = MappingProxyType({"s": 1, "sec": 1, "second": 1, "seconds": 1, "min": 60, "m": 60, "minute": 60, "minutes": 60, "mins": 60,
         "h": 3600, "hr": 3600, "hour": 3600, "hours": 3600, "d": 86400, "day": 86400, "days": 86400})
"""Duration units (HL7 table 0395 / ISO+ / UCUM codes, any case); none given: minutes."""
# Where a resource segment keeps its start and its duration (value, units).
RESOURCE_TIMES = (("AIS", 4, 7, 8), ("AIG", 8, 11, 12), ("AIL", 6, 9, 10), ("AIP", 6, 9, 10))
MAX_KEY = 200
MAX_CONTROL_ID = 199
"""MSH-10's longest (HL7 v2.7's ST length; v2.5.1 says 20): what an ACK's MSA-2 echoes whole."""
STORED_FROM = MappingProxyType({"key": "SCH-2", "reason": "SCH-7", "appointment_type": "SCH-8", "location": "AIL-3",
               "physician_npi": "AIP-3", "patient_identifier": "PID-3", "patient_authority": "PID-3",
               "patient_first_name": "PID-5", "patient_last_name": "PID-5"})
"""Where each text an `Update` stores comes from (an ERR-2 location)."""


class Refused(Exception):
    """`ack` AR or AE; `text` why; `where` the field (`SCH-11.4`); `code` HL7 table 0357's."""

    def __init__(self, ack: str, text: str, where: str = "", code: str = "207"):
        super().__init__(text)
        self.ack, self.text, self.where, self.code = ack, text, where, code


@dataclass(frozen=True)
class Header:
    facility: str
    control_id: str
    message_type: str    # "SIU^S12" as received (the first two components)
    trigger: str
    sending_application: str
    receiving_application: str
    receiving_facility: str
    version: str


@dataclass(frozen=True)
class Update:
    """One appointment as a message tells it; `remove` for S17. `message_time` orders it (MSH-7, or
    when it was received if MSH-7 was more than `CLOCK_SKEW` ahead: `sent_at` keeps MSH-7 as read)."""

    key: str
    message_time: dt.datetime
    remove: bool = False
    sent_at: dt.datetime | None = None
    ahead: bool = False
    start: dt.datetime | None = None
    end: dt.datetime | None = None
    status: str = "booked"
    physician_npi: str = ""
    appointment_type: str = ""
    reason: str = ""
    location: str = ""
    patient_identifier: str = ""
    patient_authority: str = ""
    patient_first_name: str = ""
    patient_last_name: str = ""
    patient_date_of_birth: dt.date | None = None
    patient_sex: str = "unknown"


def header(m: Message) -> Header:
    """MSH as far as it can be read; the type, trigger and version are checked by `check_type`."""
    msh = m.first("MSH")

    def value(field: int) -> str:  # metadata is recorded and echoed: never a NUL (PostgreSQL refuses it in text)
        return m.value(msh, field, 1).replace("\x00", "")
    kind, trigger = value(9), m.value(msh, 9, 2).replace("\x00", "")
    return Header(facility=value(4), control_id=value(10), message_type=f"{kind}^{trigger}" if trigger else kind,
                  trigger=trigger, sending_application=value(3), receiving_application=value(5),
                  receiving_facility=value(6), version=value(12))


def check_type(m: Message, h: Header) -> None:
    """`AR` unless the message is one we take: SIU^S12-S26 of HL7 v2.3-v2.5.1, with a control id."""
    msh = m.first("MSH")
    if not h.control_id:
        raise Refused("AR", "MSH-10 (message control id) is empty", "MSH-10", "101")
    if len(m.value(msh, 10, 1)) > MAX_CONTROL_ID:
        raise Refused("AR", f"MSH-10 is longer than {MAX_CONTROL_ID} characters", "MSH-10", "102")
    if m.value(msh, 9, 1) != "SIU" or h.trigger not in TRIGGERS:
        raise Refused("AR", f"message type {h.message_type[:20]!r} is not accepted (SIU^{', SIU^'.join(TRIGGERS)})",
                      "MSH-9", "200" if m.value(msh, 9, 1) != "SIU" else "201")
    if h.version not in VERSIONS:
        raise Refused("AR", f"HL7 version {h.version[:10]!r} is not accepted ({', '.join(VERSIONS)})", "MSH-12", "203")


def _time(value: str, zone: str, where: str, received: dt.datetime | None = None) -> dt.datetime:
    try:
        return parse_dtm(value, zone, received)
    except BadTime:
        raise Refused("AE", f"{where} is not an HL7 DTM", where, "102") from None


def _duration(m: Message, segment, value_field: int, units_field: int, where: str) -> dt.timedelta | None:
    value = m.value(segment, value_field, 1)
    if not value:
        return None
    units = m.value(segment, units_field, 1).lower()
    try:
        amount = float(value)
        if not 0 <= amount <= 10 ** 7:
            raise ValueError
    except ValueError:
        raise Refused("AE", f"{where} is not a duration", where, "102") from None
    if units and units not in UNITS:
        raise Refused("AE", f"{where}'s units are not a known time unit", where, "103")
    return dt.timedelta(seconds=amount * UNITS.get(units, 60))


def _times(m: Message, zone: str) -> tuple[dt.datetime, dt.datetime]:
    sch = m.first("SCH")
    start_text, end_text = m.value(sch, 11, 4), m.value(sch, 11, 5)
    start = _time(start_text, zone, "SCH-11.4") if start_text else None
    source = None
    if start is None:
        for name, start_field, value_field, units_field in RESOURCE_TIMES:
            for segment in m.all(name):
                text = m.value(segment, start_field, 1)
                if text:
                    start = _time(text, zone, f"{name}-{start_field}")
                    source = (segment, name, value_field, units_field)
                    break
            if start is not None:
                break
    if start is None:
        raise Refused("AE", "no start time (SCH-11.4, AIS-4, AIG-8, AIL-6 or AIP-6)", "SCH-11.4", "101")
    if end_text:
        end = _time(end_text, zone, "SCH-11.5")
    else:
        where = "SCH-9"
        length = _duration(m, sch, 9, 10, where)
        if length is None and source is not None:
            segment, name, value_field, units_field = source
            where = f"{name}-{value_field}"
            length = _duration(m, segment, value_field, units_field, where)
        if length is None:
            raise Refused("AE", "no end time (SCH-11.5, SCH-9, or the duration of the segment giving the start)",
                          "SCH-11.5", "101")
        try:
            end = start + length
        except OverflowError:  # past year 9999: not a time any database or snapshot can hold
            raise Refused("AE", "the appointment's end (start + duration) is out of range", where, "102") from None
    if end < start:
        raise Refused("AE", "the appointment ends before it starts", "SCH-11.5", "102")
    return start, end


def _physician(m: Message) -> str:
    """The NPI of the first XCN in any AIP-3, else in PV1-7, typed NPI (XCN.13) or assigned by the NPI OID (XCN.9)."""
    for segments, field, where in ((m.all("AIP"), 3, "AIP-3"), ([m.first("PV1")], 7, "PV1-7")):
        for segment in segments:
            for raw in m.repetitions(segment, field):
                authority = {m.part(raw, 9, sub) for sub in (1, 2, 3)}
                if m.part(raw, 13).upper() == "NPI" or NPI_OID in authority or f"urn:oid:{NPI_OID}" in authority:
                    npi = m.part(raw, 1)
                    if not is_npi(npi):
                        raise Refused("AE", f"{where} names an NPI that is not 10 digits", where, "102")
                    return npi
    return ""


def _text(m: Message, segment, field: int) -> str:
    """A CE/CWE's text (component 2), else its identifier."""
    return m.value(segment, field, 2) or m.value(segment, field, 1)


def _location(m: Message) -> str:
    ail = m.first("AIL")
    reps = m.repetitions(ail, 3)
    if not reps:
        return ""
    return ", ".join(p for p in (m.part(reps[0], 1), m.part(reps[0], 2), m.part(reps[0], 3), m.part(reps[0], 4))
                     if p)


def appointment(m: Message, h: Header, zone: str, received: dt.datetime | None = None) -> Update:
    """The appointment the message carries; `AE` when it cannot be applied. `received` (naive UTC)
    reads an MSH-7 without an offset in the hour repeated when clocks go back (`parse_dtm`), and
    orders a message whose MSH-7 is more than `CLOCK_SKEW` ahead of it as sent when received (a
    sender's clock a year ahead must not make every later message about that appointment older)."""
    if m.has_nul:
        raise Refused("AE", "the message contains a NUL character")
    if len(m.all("MSH")) > 1:   # read as one, its segments would mix (another appointment's physician...)
        raise Refused("AE", "more than one MSH segment: one message per MLLP frame", "MSH", "100")
    if m.malformed:
        raise Refused("AE", f"{m.malformed} segment(s) after MSH do not begin with a segment name (three capital "
                      "letters or digits)", "", "100")
    sch = m.first("SCH")
    key = m.value(sch, 2, 1) or m.value(sch, 1, 1)
    if not key:
        raise Refused("AE", "no appointment key (SCH-2 and SCH-1 are empty)", "SCH-2", "101")
    if len(key) > MAX_KEY:
        raise Refused("AE", f"the appointment key is longer than {MAX_KEY} characters", "SCH-2", "102")
    sent = m.value(m.first("MSH"), 7, 1)
    if not sent:
        raise Refused("AE", "MSH-7 (the message's time) is empty", "MSH-7", "101")
    sent_at = _time(sent, zone, "MSH-7", received)
    ahead = received is not None and sent_at > received + CLOCK_SKEW
    # To the second, as MSH-7 usually is: a message stamped in the second it was received is not older.
    times = dict(message_time=received.replace(microsecond=0) if ahead else sent_at, sent_at=sent_at, ahead=ahead)
    if h.trigger == "S17":
        return _without_nul(Update(key=key, remove=True, **times))
    start, end = _times(m, zone)
    filler = m.value(sch, 25, 1)
    status = STATUSES.get(filler.lower()) if filler else "booked"
    if status is None:
        raise Refused("AE", f"SCH-25 {filler[:20]!r} is not a known filler status ({', '.join(s.capitalize() for s in STATUSES)})",
                      "SCH-25", "103")
    status = TRIGGER_STATUS.get(h.trigger, status)
    pid = m.first("PID")
    birth = m.value(pid, 7, 1)
    try:
        date_of_birth = parse_date(birth) if birth else None
    except BadTime:
        raise Refused("AE", "PID-7 is not an HL7 date", "PID-7", "102") from None
    return _without_nul(Update(
        key=key, **times, start=start, end=end, status=status, physician_npi=_physician(m),
        appointment_type=_text(m, sch, 8)[:64], reason=_text(m, sch, 7)[:500], location=_location(m)[:200],
        patient_identifier=m.value(pid, 3, 1)[:200],
        patient_authority=(m.value(pid, 3, 4, 2) or m.value(pid, 3, 4, 1))[:200],
        patient_first_name=m.value(pid, 5, 2)[:100], patient_last_name=m.value(pid, 5, 1)[:100],
        patient_date_of_birth=date_of_birth, patient_sex=SEXES.get(m.value(pid, 8, 1).upper(), "unknown")))


def _without_nul(update: Update) -> Update:
    """`update`, unless a text it stores holds a NUL (an escape such as `\\X00\\` decodes to one):
    PostgreSQL refuses NUL in text, so the message cannot be applied (`AE`)."""
    for f in fields(update):
        value = getattr(update, f.name)
        if isinstance(value, str) and "\x00" in value:
            raise Refused("AE", "the message contains a NUL character", STORED_FROM.get(f.name, ""), "102")
    return update
