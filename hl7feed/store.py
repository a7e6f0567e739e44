"""Applying a clinic's SIU messages to its feed appointments (`models.hl7`), and what is kept.

`receive(runtime, data, peer, client_names)` takes one message off the wire and returns its
`Outcome` (the ACK's code and why); it runs on a pool thread. A clinic's message is taken only from
an address in its `--hl7-allow` and, when it has `--hl7-client-subject`s, only over a connection
whose client certificate's subject CN is one of them (else `AR`). `Outcome.sender_passed` tells the
listener whether the sender passed those checks (its MSH read, MSH-4 a clinic's, address and
certificate accepted), whatever the ACK. A message is applied in one
transaction with its `FeedMessage` row, so `AA` (sent by the listener only once `receive` returned)
means committed. On PostgreSQL the transaction first takes an advisory lock on (clinic, appointment
key): several listeners on one database apply the messages of one appointment one at a time, in
MSH-7 order, and the same message sent to two of them is applied once (the second finds its control
id acknowledged; the unique index `feed_message_one_acknowledged` backs that up). SQLite
transactions are already one at a time (BEGIN IMMEDIATE).

Retention (docs/hl7-feed.md): `prune` removes appointments that ended more than `KEEP_PAST` ago
(no snapshot can hold them any more) and message records older than `MESSAGE_DAYS`; an appointment
without an NPI physician, and a removed one, is kept without its patient.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import logging
from dataclasses import dataclass, replace

import peewee
from playhouse.pool import MaxConnectionsExceeded

from hl7feed.config import allowed_networks, client_subjects
from hl7feed.message import CLOCK_SKEW, Message, ParseError, parse
from hl7feed.siu import Header, Refused, Update, appointment, check_type, header
from ops.addresses import address_of
from models.clock import utc_iso
from models.directory import Organization
from models.hl7 import FeedAppointment, FeedMessage
from models.prepared import PreparedInsert, PreparedQuery

log = logging.getLogger("svc_auth.hl7")

KEEP_PAST = dt.timedelta(days=2)
MESSAGE_DAYS = 90
PATIENT_FIELDS = ("patient_identifier", "patient_authority", "patient_first_name", "patient_last_name",
                  "patient_date_of_birth", "patient_sex", "reason")
STORED = ("message_time", "removed", "start", "end", "status", "physician_npi", "appointment_type", "location",
          *PATIENT_FIELDS, "updated_at")
"""What a message sets on its appointment's row (all of it, every time)."""

# Every message runs these: their SQL text is built once per database (models/prepared.py).
_CLINIC_OF_FACILITY = PreparedQuery(
    lambda facility: Organization.select().where(Organization.hl7_facility == facility).limit(1),
    Organization.hl7_facility)
_APPOINTMENT = PreparedQuery(
    lambda organization, key: (FeedAppointment.select(FeedAppointment.id, FeedAppointment.message_time,
                                                      FeedAppointment.start, FeedAppointment.end)
                               .where((FeedAppointment.organization == organization) & (FeedAppointment.key == key))
                               .limit(1)),
    FeedAppointment.organization, FeedAppointment.key)
_UPDATE_APPOINTMENT = PreparedQuery(
    # (Value without a converter: the argument's marker reaches the SQL text as it is; the
    # conversion is PreparedQuery's, by each field, on every call.)
    lambda *values: (FeedAppointment.update({getattr(FeedAppointment, name): peewee.Value(value, converter=False)
                                             for name, value in zip(STORED, values)})
                     .where(FeedAppointment.id == values[-1])),
    *(getattr(FeedAppointment, name) for name in STORED), FeedAppointment.id)
_INSERT_APPOINTMENT = PreparedInsert(FeedAppointment)
_INSERT_MESSAGE = PreparedInsert(FeedMessage)


@dataclass(frozen=True)
class Outcome:
    ack: str                    # AA | AE | AR
    header: Header | None       # None: MSH could not be read
    text: str = ""
    where: str = ""
    code: str = "207"           # HL7 table 0357
    change: str = ""            # AA: applied | duplicate | older
    sender_passed: bool = False  # the sender checks passed (see `receive`): True whatever the ACK


def sender_allowed(org: Organization, peer: str) -> bool:
    networks = allowed_networks(org)
    if not networks:
        return True
    address = address_of(peer)
    return address is not None and any(address in ipaddress.ip_network(n) for n in networks)


def certificate_allowed(org: Organization, client_names: tuple[str, ...]) -> bool:
    """No `--hl7-client-subject`: any connection; else one whose certificate has one of those CNs."""
    subjects = client_subjects(org)
    return not subjects or any(name in subjects for name in client_names)


def _zone(org: Organization) -> str:
    """The clinic's time zone (IANA), for times sent without an offset."""
    return org.time_zone or "UTC"


def receive(runtime, data: bytes, peer: str, client_names: tuple[str, ...] = ()) -> Outcome:
    """Parse, check and apply one message from `peer` (an IP address) over a connection whose
    client certificate has the subject CNs `client_names` (none: no verified certificate)."""
    now = runtime.clock.now()
    try:
        message = parse(data)
    except ParseError as exc:
        return Outcome("AR", None, f"the MSH segment cannot be read: {exc}", "MSH", "100")
    h = header(message)
    org = _CLINIC_OF_FACILITY.first(h.facility) if h.facility else None
    if org is None:
        log.warning("hl7: a message from %s names no clinic's facility (MSH-4 %r): AR", peer, h.facility[:64])
        return Outcome("AR", h, "MSH-4 (sending facility) names no clinic of this service", "MSH-4", "204")
    if not sender_allowed(org, peer):
        return _refused(runtime, org, h, Refused("AR", "the sender's address is not allowed for this facility",
                                                 "MSH-4"), now)
    if not certificate_allowed(org, client_names):
        return _refused(runtime, org, h, Refused("AR", "the client certificate is not allowed for this facility",
                                                 "MSH-4"), now)
    return replace(_take(runtime, org, message, h, now), sender_passed=True)


def _take(runtime, org: Organization, message: Message, h: Header, now: dt.datetime) -> Outcome:
    """Check and apply a message of a sender that passed the checks of `receive`."""
    try:
        check_type(message, h)
        update = appointment(message, h, _zone(org), now)
    except Exception as exc:  # noqa: BLE001  (content only: no database work above)
        refusal = exc if isinstance(exc, Refused) else _unapplicable(org, h, exc)
        if h.control_id and _acknowledged(org, h.control_id):  # acknowledged AA before: AA, whatever it says now
            return _duplicate(runtime, org, h, now)
        return _refused(runtime, org, h, refusal, now)
    try:
        outcome = _apply(runtime, org, h, update, now)
    except peewee.IntegrityError:  # this control id was acknowledged AA before (here or by another listener)
        return _duplicate(runtime, org, h, now)
    except Exception as exc:  # noqa: BLE001
        if database_unavailable(exc):  # the listener closes without an ACK: the sender sends it again
            raise
        return _refused(runtime, org, h, _unapplicable(org, h, exc), now)
    if update.ahead:
        log.warning("hl7 %s from %s: MSH-7 %s is more than %d minutes ahead of this listener's clock: ordered as "
                    "received (%s)", h.control_id[:40], org.id, utc_iso(update.sent_at), CLOCK_SKEW.seconds // 60,
                    utc_iso(update.message_time))
    return outcome


def database_unavailable(exc: BaseException) -> bool:
    """The database failed (down, busy, its own error), as opposed to refusing what the message
    holds (a value it cannot store: peewee's DataError, or the driver's ValueError/OverflowError)."""
    if isinstance(exc, peewee.DataError):
        return False
    return isinstance(exc, (peewee.DatabaseError, peewee.InterfaceError, MaxConnectionsExceeded))


def _unapplicable(org: Organization, h: Header, exc: Exception) -> Refused:
    """`AE` for content no check above foresaw; logged by its type only (never the values)."""
    log.error("hl7 %s from %s: %s while applying it: AE", h.control_id[:40], org.id, type(exc).__name__)
    return Refused("AE", "the message holds a value that cannot be applied", "", "207")


def _acknowledged(org: Organization, control_id: str) -> bool:
    return FeedMessage.select().where((FeedMessage.organization == org.id) & (FeedMessage.control_id == control_id)
                                      & (FeedMessage.first == True)).exists()  # noqa: E712


def _record(org: Organization, h: Header, ack: str, now: dt.datetime, error: str | None = None,
            first: bool = False, sent_at: dt.datetime | None = None, note: str | None = None) -> None:
    _INSERT_MESSAGE.insert(organization=org.id, control_id=h.control_id[:200], message_type=h.message_type[:32],
                           received_at=now, ack=ack, error=error[:500] if error else None, first=first,
                           sent_at=sent_at, note=note)


def _note(update: Update) -> str | None:
    """The record's note of a message taken `AA`: an MSH-7 more than `CLOCK_SKEW` ahead of our clock,
    and an appointment without a physician's NPI (it can be in no physician's snapshot)."""
    notes = []
    if update.ahead:
        notes.append(f"MSH-7 is more than {CLOCK_SKEW.seconds // 60} minutes ahead of this service's clock: "
                     f"ordered as received ({utc_iso(update.message_time)})")
    if not update.remove and not update.physician_npi:
        notes.append("no physician NPI in AIP-3 or PV1-7: in no snapshot")
    return "; ".join(notes) or None


def _refused(runtime, org, h, refusal: Refused, now) -> Outcome:
    with runtime.db.atomic():
        _record(org, h, refusal.ack, now, refusal.text)
    log.info("hl7 %s from %s: %s %s", h.control_id[:40], org.id, refusal.ack, refusal.text)
    return Outcome(refusal.ack, h, refusal.text, refusal.where, refusal.code)


def _duplicate(runtime, org, h, now) -> Outcome:
    with runtime.db.atomic():
        _record(org, h, "AA", now)
    return Outcome("AA", h, change="duplicate")


def _lock(db, org: Organization, key: str) -> None:
    """PostgreSQL: this transaction holds the appointment until it ends (other listeners wait)."""
    if isinstance(db, peewee.PostgresqlDatabase):
        digest = hashlib.sha256(f"hl7\x00{org.id}\x00{key}".encode()).digest()
        db.execute_sql("SELECT pg_advisory_xact_lock(%s)", (int.from_bytes(digest[:8], "big", signed=True),))


def _apply(runtime, org: Organization, h: Header, update: Update, now: dt.datetime) -> Outcome:
    db = runtime.db
    with db.atomic():
        _lock(db, org, update.key)
        # The first AA of this control id, or IntegrityError (acknowledged before: `receive` answers
        # AA, and this transaction, which changed nothing yet, is rolled back).
        _record(org, h, "AA", now, first=True, sent_at=update.sent_at, note=_note(update))
        row = _APPOINTMENT.first(org.id, update.key)
        if row is not None and update.message_time < row.message_time:
            return Outcome("AA", h, change="older")
        values = _values(update, row, now)
        if row is None:
            _INSERT_APPOINTMENT.insert(organization=org.id, key=update.key, **values)
        else:
            _UPDATE_APPOINTMENT.execute(*(values[name] for name in STORED), row.id)
    return Outcome("AA", h, change="applied")


def _values(update: Update, row: FeedAppointment | None, now: dt.datetime) -> dict:
    """The row's every stored column (`STORED`) after `update`."""
    values = {name: getattr(update, name) for name in STORED if hasattr(update, name)}
    if update.remove:  # a tombstone: the key, the times and MSH-7 (for order and retention); no patient
        values.update(start=row.start if row is not None else None, end=row.end if row is not None else None,
                      status="cancelled", appointment_type="", location="", physician_npi="")
    if update.remove or not update.physician_npi:  # in nobody's snapshot: no patient kept
        values.update({f: "" for f in PATIENT_FIELDS}, patient_date_of_birth=None, patient_sex="unknown")
    return {**values, "removed": update.remove, "updated_at": now}


def prune(runtime, now: dt.datetime, organization_id: str | None = None) -> tuple[int, int]:
    """Remove what no snapshot needs any more; returns (appointments, messages) removed."""
    past = now - KEEP_PAST
    gone = (FeedAppointment.end < past) | (FeedAppointment.end.is_null() & (FeedAppointment.message_time < past))
    old = FeedMessage.received_at < now - dt.timedelta(days=MESSAGE_DAYS)
    if organization_id is not None:
        gone &= FeedAppointment.organization == organization_id
        old &= FeedMessage.organization == organization_id
    with runtime.db.atomic():
        appointments = FeedAppointment.delete().where(gone).execute()
        messages = FeedMessage.delete().where(old).execute()
    return appointments, messages


def recent_messages(organization_id: str, limit: int) -> list[dict]:
    """`hl7 messages`: newest first."""
    query = (FeedMessage.select().where(FeedMessage.organization == organization_id)
             .order_by(FeedMessage.received_at.desc(), FeedMessage.id.desc()).limit(limit))
    return [{"control_id": m.control_id, "type": m.message_type, "received_at": utc_iso(m.received_at),
             "ack": m.ack, "error": m.error, "sent_at": utc_iso(m.sent_at), "note": m.note}
            for m in query]
