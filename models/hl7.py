"""What a clinic's HL7v2 SIU feed left us (docs/hl7-feed.md): its appointments, and the messages'
metadata (`svc-auth hl7 messages`).

`FeedAppointment` is the clinic's live schedule as the feed told it, one row per appointment key
(SCH-2, else SCH-1), newest message first: `message_time` (MSH-7, naive UTC) is the time of the
message that made the row what it is, and an older message changes nothing. An S17 leaves a row
with `removed` set (a tombstone), so an older message cannot bring it back. The patient's details
are kept only while the row can still be in a snapshot (`hl7feed.store.prune`).

`FeedMessage` is one message received from a clinic's facility: its control id (MSH-10), type,
when, and how it was acknowledged, and for one taken `AA` its MSH-7 as sent (`sent_at`: a time
more than the allowed clock skew ahead of ours orders the message as received, and `note` says
so); never its content. `first` marks the one acknowledged `AA`
row of a control id per clinic (a unique index): a message sent again, to this listener or to
another one on the same database, is acknowledged `AA` and changes nothing.
"""
from __future__ import annotations

import peewee

from models.db import BaseModel, wall_now
from models.directory import Organization


class FeedAppointment(BaseModel):
    organization = peewee.ForeignKeyField(Organization, on_delete="CASCADE")
    key = peewee.CharField(max_length=200)             # SCH-2 (filler appointment id), else SCH-1
    message_time = peewee.DateTimeField()               # MSH-7 of the message applied last (naive UTC)
    removed = peewee.BooleanField(default=False)        # S17: deleted; kept so an older message stays older
    start = peewee.DateTimeField(null=True)             # naive UTC
    end = peewee.DateTimeField(null=True)
    status = peewee.CharField(max_length=32, default="booked")  # a FHIR AppointmentStatus code
    physician_npi = peewee.CharField(max_length=10, default="")
    appointment_type = peewee.CharField(max_length=64, default="")
    reason = peewee.CharField(max_length=500, default="")
    location = peewee.CharField(max_length=200, default="")
    # The patient: PID-3's first CX (CX.1 and CX.4's universal id or namespace), PID-5, PID-7, PID-8.
    patient_identifier = peewee.CharField(max_length=200, default="")
    patient_authority = peewee.CharField(max_length=200, default="")
    patient_first_name = peewee.CharField(max_length=100, default="")
    patient_last_name = peewee.CharField(max_length=100, default="")
    patient_date_of_birth = peewee.DateField(null=True)
    patient_sex = peewee.CharField(max_length=16, default="unknown")
    updated_at = peewee.DateTimeField(default=wall_now)

    class Meta:
        indexes = ((("organization", "key"), True), (("organization", "physician_npi", "start"), False))


class FeedMessage(BaseModel):
    organization = peewee.ForeignKeyField(Organization, on_delete="CASCADE")
    control_id = peewee.CharField(max_length=200)        # MSH-10
    message_type = peewee.CharField(max_length=32)        # "SIU^S12"
    received_at = peewee.DateTimeField(default=wall_now)
    ack = peewee.CharField(max_length=2)                  # AA | AE | AR
    error = peewee.CharField(max_length=500, null=True)   # why AE/AR (never patient data)
    first = peewee.BooleanField(default=False)            # the first AA of this control id in this clinic
    sent_at = peewee.DateTimeField(null=True)             # MSH-7 as read (naive UTC), of a message applied or older
    note = peewee.CharField(max_length=200, null=True)    # what was done besides (an MSH-7 ahead: ordered as received; no NPI)

    class Meta:
        indexes = ((("organization", "received_at"), False),)


ONE_ACKNOWLEDGED = FeedMessage.index(FeedMessage.organization, FeedMessage.control_id, unique=True,
                                     where=(FeedMessage.first == True), name="feed_message_one_acknowledged")  # noqa: E712
FeedMessage.add_index(ONE_ACKNOWLEDGED)
