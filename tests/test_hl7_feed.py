"""The HL7v2 SIU feed (docs/hl7-feed.md) end to end: a real `svc-auth hl7 listen` process, messages
sent over MLLP by python-hl7 (an HL7 library nobody here wrote), with and without TLS, on SQLite
and PostgreSQL; the faults (oversize, garbage, silence, a sender not allowed, kill -9, two
listeners on one database); and the night built from what the feed stored."""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time

import hl7
import hl7.client
import hl7.mllp
import pytest

from helpers.environment import ROOT
from helpers.fhir_ehr import patient, start_fhir_ehr
from helpers.hub import hub_page_at
from helpers.processes import free_port, settings_env, start_process, stop_process, wait_for_port, wait_until
from hl7feed.config import configure_feed
from hl7feed.slots import Slots
from ops.addresses import counted_as as peer_key
from lifecycle.verification import record_platform_verification
from models.appointments import SnapshotAppointment
from models.hl7 import FeedAppointment, FeedMessage
from workers.activity import record_activity
from workers.snapshot import build_snapshot, night_window

FACILITY = "NORTH_CLINIC"
NIGHT = dt.date(2030, 3, 4)
FEED_CLOCK = dt.datetime(2030, 3, 2)
"""The listeners' clock (UTC) when a test sets none: after every MSH-7 the tests send (an MSH-7 more
than 10 minutes ahead of the listener's clock would be ordered as received)."""
SB, EB = b"\x0b", b"\x1c\x0d"


def siu(trigger: str, control: str, key: str, *, facility: str = FACILITY, sent: str = "20300301090000",
        start: str = "20300305093000", end: str = "20300305095000", npi: str = "1234567893", status: str = "Booked",
        mrn: str = "E1234567", version: str = "2.5.1", kind: str = "SIU", sch_times: bool = True,
        pid3: str | None = None, xcn: str | None = None) -> str:
    """An SIU message shaped like Epic's Cadence example (research/epic_schedules.md, section 3)."""
    xcn = xcn or f"{npi}^TOR^DOC^^^^^^NPI&2.16.840.1.113883.4.6&ISO^^^^NPI"
    timing = f"^^^{start}^{end}" if sch_times else ""
    return "\r".join([
        f"MSH|^~\\&|EPIC|{facility}|SVCAUTH|HUB|{sent}||{kind}^{trigger}^SIU_{trigger}|{control}|P|{version}",
        f"SCH||{key}||||ROUTINE^Routine check|FOLLOWUP^Follow-up|OFFICE VISIT|20|MIN|{timing}||||||||||||||{status}",
        f"PID|||{pid3 or mrn + '^^^EPI^MR'}||DOE^JANE||19800101|F",
        f"PV1||O|IM^^^CLINIC||||{xcn}",
        "RGS|1",
        "AIS|1||1001^OFFICE VISIT",
        "AIL|1||IM^ROOM 4^^NORTH",
        f"AIP|1||{xcn}|1^MD||{start}|0|MIN|20|MIN",
    ])


def acked(reply) -> tuple[str, str, str]:
    """(MSA-1, MSA-2, ERR text) of an ACK (MLLP-framed bytes, or an hl7.Message), read by python-hl7."""
    if isinstance(reply, bytes):
        assert reply[:1] == SB and reply[-2:] == EB, reply[:40]
        reply = reply[1:-2].decode()
    message = hl7.parse(str(reply))
    assert str(message.segment("MSH")[9]).startswith("ACK")
    err = [s for s in message if str(s[0]) == "ERR"]
    return str(message.segment("MSA")[1]), str(message.segment("MSA")[2]), str(err[0][8]) if err else ""


@pytest.fixture
def feed_clinic(runtime, world):
    """`world`'s clinic on the SIU feed as facility NORTH_CLINIC (any sender address)."""
    return configure_feed(world.org.id, "siu", FACILITY, [])


@pytest.fixture
def listen(settings, tmp_path):
    """Starts `svc-auth hl7 listen` processes on the test's database; `listen(*args, idle=300, **env)`
    -> (process, port), its clock at FEED_CLOCK unless SVC_CLOCK_OFFSET is given. Each is stopped
    after the test."""
    procs = []

    def start(*args, idle: int = 300, port: int = 0, **env: str):
        env.setdefault("SVC_CLOCK_OFFSET", str((FEED_CLOCK - dt.datetime.now(dt.timezone.utc).replace(tzinfo=None))
                                               .total_seconds()))
        env = settings_env(settings, SVC_HL7_IDLE_TIMEOUT=str(idle), **env)
        log_path = tmp_path / f"hl7-{len(procs)}.log"
        proc = start_process(["hl7", "listen", "--host", "127.0.0.1", "--port", str(port), *args], env,
                             log_path=log_path)
        procs.append(proc)
        # Ready once it logs that it listens, not once a probe connects: the listener counts a
        # connection until it has read its end, so a probe could still hold one of the caps
        # (SVC_HL7_MAX_CONNECTIONS, _PER_PEER) the test then fills (a loaded machine showed it).
        # Port 0 by default: the listener binds one the system chooses and logs it (a port found
        # free beforehand could be taken by another process before the listener bound it).
        listening = re.compile(rf"hl7 listener on 127\.0\.0\.1:({port or '[0-9]+'}) ")
        wait_until(lambda: proc.poll() is not None or listening.search(log_path.read_text()), 60,
                   "the listener listening")
        assert proc.poll() is None, log_path.read_text()[-2000:]
        return proc, int(listening.search(log_path.read_text()).group(1))
    yield start
    for proc in procs:
        stop_process(proc)


def appointment(org, key) -> FeedAppointment | None:
    return FeedAppointment.get_or_none((FeedAppointment.organization == org.id) & (FeedAppointment.key == key))


def hl7_messages(settings, org) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "cli.__main__", "hl7", "messages", "--org", org.id, "--json"],
                         env=settings_env(settings), cwd=str(ROOT), capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_every_trigger_over_mllp(runtime, feed_clinic, listen, settings):
    _, port = listen()
    org = feed_clinic
    with hl7.client.MLLPClient("127.0.0.1", port) as client:
        assert acked(client.send_message(siu("S12", "M1", "A-100")))[:2] == ("AA", "M1")
        row = appointment(org, "A-100")
        assert (row.start, row.end, row.status, row.physician_npi) == (
            dt.datetime(2030, 3, 5, 9, 30), dt.datetime(2030, 3, 5, 9, 50), "booked", "1234567893")
        assert (row.patient_identifier, row.patient_last_name, row.patient_first_name, row.patient_sex,
                row.patient_date_of_birth) == ("E1234567", "DOE", "JANE", "female", dt.date(1980, 1, 1))
        assert (row.reason, row.appointment_type, row.location) == ("Follow-up", "OFFICE VISIT", "IM, ROOM 4, NORTH")
        # S13: rescheduled.
        assert acked(client.send_message(siu("S13", "M2", "A-100", sent="20300301091000", start="20300306100000",
                                             end="20300306103000")))[0] == "AA"
        assert appointment(org, "A-100").start == dt.datetime(2030, 3, 6, 10, 0)
        # S14: modified; no SCH-11: start from AIS/AIL/AIP, end = start + SCH-9/10 (20 MIN).
        assert acked(client.send_message(siu("S14", "M3", "A-100", sent="20300301092000", start="20300307080000",
                                             sch_times=False)))[0] == "AA"
        row = appointment(org, "A-100")
        assert (row.start, row.end) == (dt.datetime(2030, 3, 7, 8, 0), dt.datetime(2030, 3, 7, 8, 20))
        # S15: cancelled, whatever SCH-25 says; S26: no-show.
        assert acked(client.send_message(siu("S15", "M4", "A-100", sent="20300301093000")))[0] == "AA"
        assert appointment(org, "A-100").status == "cancelled"
        assert acked(client.send_message(siu("S26", "M5", "A-100", sent="20300301094000")))[0] == "AA"
        assert appointment(org, "A-100").status == "noshow"
        # Any listed trigger for an unknown appointment creates it.
        assert acked(client.send_message(siu("S14", "M6", "A-200", status="Pending")))[0] == "AA"
        assert appointment(org, "A-200").status == "pending"
        # S17: removed (a tombstone without the patient, so an older message stays older).
        assert acked(client.send_message(siu("S17", "M7", "A-100", sent="20300301095000")))[0] == "AA"
        row = appointment(org, "A-100")
        assert row.removed and row.patient_identifier == "" and row.patient_date_of_birth is None
        assert acked(client.send_message(siu("S12", "M8", "A-100", sent="20300301080000")))[0] == "AA"
        assert appointment(org, "A-100").removed, "an older S12 does not bring a removed appointment back"
    listed = hl7_messages(settings, org)
    assert [m["control_id"] for m in listed] == ["M8", "M7", "M6", "M5", "M4", "M3", "M2", "M1"]
    assert {m["type"] for m in listed} == {"SIU^S12", "SIU^S13", "SIU^S14", "SIU^S15", "SIU^S26", "SIU^S17"}
    assert all(m["ack"] == "AA" and m["error"] is None and m["received_at"].endswith("Z") for m in listed)


def test_times_without_an_offset_are_in_the_clinics_time_zone(runtime, feed_clinic, listen):
    from lifecycle.organizations import update_organization
    update_organization(feed_clinic.id, time_zone="America/Chicago")
    _, port = listen()
    with hl7.client.MLLPClient("127.0.0.1", port) as client:
        # 09:30 in Chicago on 5 March 2030 (CST, UTC-6); an explicit offset is taken as sent.
        assert acked(client.send_message(siu("S12", "Z1", "Z-1")))[0] == "AA"
        assert acked(client.send_message(siu("S12", "Z2", "Z-2", start="20300305093000+0100",
                                             end="20300305100000+0100")))[0] == "AA"
        # In summer (CDT, UTC-5), and an MSH-7 without an offset orders in the same zone.
        assert acked(client.send_message(siu("S12", "Z3", "Z-3", start="20300705093000", end="20300705100000")))[0] == "AA"
    assert (appointment(feed_clinic, "Z-1").start, appointment(feed_clinic, "Z-1").end) == (
        dt.datetime(2030, 3, 5, 15, 30), dt.datetime(2030, 3, 5, 15, 50))
    assert appointment(feed_clinic, "Z-2").start == dt.datetime(2030, 3, 5, 8, 30)
    assert appointment(feed_clinic, "Z-3").start == dt.datetime(2030, 7, 5, 14, 30)
    assert appointment(feed_clinic, "Z-1").message_time == dt.datetime(2030, 3, 1, 15, 0)


def test_a_cancellation_in_the_repeated_hour_is_not_taken_for_older(runtime, feed_clinic, listen):
    """Chicago's clocks go back on 3 November 2030 at 02:00 CDT: 01:00-02:00 comes twice. An S12
    stamped 01:50 (no offset) during the first pass (06:50 UTC), then its S15 stamped 01:10 during
    the second (07:10 UTC, 20 minutes later): the cancellation is applied (read as its first pass,
    06:10, it was taken for older and dropped, though acknowledged AA). Each listener's clock is
    set to when its message is sent; a message of the first pass received during the second still
    reads as the first pass (its second reading is in the future), and is older."""
    from lifecycle.organizations import update_organization
    update_organization(feed_clinic.id, time_zone="America/Chicago")

    def listener_at(moment: dt.datetime) -> int:
        offset = (moment - dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)).total_seconds()
        return listen(SVC_CLOCK_OFFSET=str(offset))[1]

    sent = {"start": "20301104093000", "end": "20301104095000"}
    with hl7.client.MLLPClient("127.0.0.1", listener_at(dt.datetime(2030, 11, 3, 6, 50))) as first_pass:
        assert acked(first_pass.send_message(siu("S12", "DST1", "DST-1", sent="20301103015000", **sent)))[0] == "AA"
    assert appointment(feed_clinic, "DST-1").message_time == dt.datetime(2030, 11, 3, 6, 50)
    with hl7.client.MLLPClient("127.0.0.1", listener_at(dt.datetime(2030, 11, 3, 7, 10))) as second_pass:
        assert acked(second_pass.send_message(siu("S15", "DST2", "DST-1", sent="20301103011000", **sent)))[0] == "AA"
        row = appointment(feed_clinic, "DST-1")
        assert (row.status, row.message_time) == ("cancelled", dt.datetime(2030, 11, 3, 7, 10))
        # A first-pass message (01:55 CDT) arriving now: 06:55 UTC (07:55 has not come), older.
        assert acked(second_pass.send_message(siu("S14", "DST3", "DST-1", sent="20301103015500", **sent)))[0] == "AA"
        assert appointment(feed_clinic, "DST-1").status == "cancelled"


def test_an_msh7_far_ahead_of_our_clock_does_not_freeze_the_appointment(runtime, feed_clinic, listen, settings,
                                                                         tmp_path):
    """An S12 stamped a year ahead (a sender's clock gone wrong), then an S15 stamped now: the
    cancellation is applied (the S12 is ordered as received, to the second; by its MSH-7 every
    message for a year was older: acknowledged AA and dropped). Its record keeps the MSH-7 as sent
    and says what was done; an MSH-7 within the allowed skew (10 minutes) orders as sent."""
    _, port = listen(SVC_CLOCK_OFFSET="0")

    def stamp(moment: dt.datetime) -> str:
        return moment.strftime("%Y%m%d%H%M%S") + "+0000"

    def utc_now() -> dt.datetime:
        return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    year_ahead = utc_now().replace(microsecond=0) + dt.timedelta(days=365)
    with hl7.client.MLLPClient("127.0.0.1", port) as client:
        before = utc_now().replace(microsecond=0)
        assert acked(client.send_message(siu("S12", "FU1", "FU-1", sent=stamp(year_ahead))))[:2] == ("AA", "FU1")
        assert appointment(feed_clinic, "FU-1").status == "booked"
        assert acked(client.send_message(siu("S15", "FU2", "FU-1", sent=stamp(utc_now()))))[:2] == ("AA", "FU2")
        row = appointment(feed_clinic, "FU-1")
        assert row.status == "cancelled" and before <= row.message_time <= utc_now()
        # A clock 5 minutes ahead is within the skew: that MSH-7 orders the message as it says.
        near = utc_now().replace(microsecond=0) + dt.timedelta(minutes=5)
        assert acked(client.send_message(siu("S12", "FU3", "FU-3", sent=stamp(near))))[0] == "AA"
        assert appointment(feed_clinic, "FU-3").message_time == near
    listed = {m["control_id"]: m for m in hl7_messages(settings, feed_clinic)}
    assert listed["FU1"]["sent_at"] == year_ahead.isoformat() + "Z"
    assert "ahead of this service's clock" in listed["FU1"]["note"] and listed["FU1"]["ack"] == "AA"
    assert listed["FU2"]["note"] is None and listed["FU3"]["note"] is None
    assert listed["FU3"]["sent_at"] == near.isoformat() + "Z"
    wait_until(lambda: "FU1" in (tmp_path / "hl7-0.log").read_text(), 30, "the listener's log line")
    logged = [line for line in (tmp_path / "hl7-0.log").read_text().splitlines() if "ordered as received" in line]
    assert len(logged) == 1 and "FU1" in logged[0] and year_ahead.isoformat() + "Z" in logged[0]


def test_duplicates_and_older_messages_change_nothing(runtime, feed_clinic, listen):
    _, port = listen()
    org = feed_clinic
    with hl7.client.MLLPClient("127.0.0.1", port) as client:
        assert acked(client.send_message(siu("S12", "D1", "B-1", sent="20300301100000")))[0] == "AA"
        # The same control id again, now saying something else: AA, nothing changes.
        assert acked(client.send_message(siu("S15", "D1", "B-1", sent="20300301110000")))[:2] == ("AA", "D1")
        assert appointment(org, "B-1").status == "booked"
        # A newer message applies; an older one after it is acknowledged and changes nothing.
        assert acked(client.send_message(siu("S13", "D2", "B-1", sent="20300301120000", start="20300308090000",
                                             end="20300308091500")))[0] == "AA"
        assert acked(client.send_message(siu("S13", "D3", "B-1", sent="20300301113000", start="20300309090000",
                                             end="20300309091500")))[0] == "AA"
        assert appointment(org, "B-1").start == dt.datetime(2030, 3, 8, 9, 0)
    assert FeedMessage.select().where((FeedMessage.control_id == "D1") & FeedMessage.first).count() == 1


def test_refusals_carry_an_err_and_store_nothing(runtime, world, feed_clinic, listen, settings):
    _, port = listen()
    org = feed_clinic
    cases = [
        (siu("S12", "R1", "C-1", facility="SOMEONE_ELSE"), "AR", "MSH-4"),
        (siu("A01", "R2", "C-2", kind="ADT"), "AR", "not accepted"),
        (siu("S16", "R3", "C-3"), "AR", "not accepted"),
        (siu("S12", "R4", "C-4", version="2.7"), "AR", "version"),
        (siu("S12", "R5", ""), "AE", "no appointment key"),
        (siu("S12", "R6", "C-6", start="2030-03-05T09:30"), "AE", "not an HL7 DTM"),
        (siu("S12", "R7", "C-7", status="Maybe"), "AE", "SCH-25"),
        (siu("S12", "R8", "C-8", sent="yesterday"), "AE", "MSH-7"),
        ("PID|||1", "AR", "MSH"),
        (siu("S12", "R11", "C-11").replace("DOE^JANE", "DOE\x00^JANE"), "AE", "NUL"),
        (siu("S12", "R12\x00", "C-12").replace("DOE^JANE", "DOE\x00^JANE"), "AE", "NUL"),
    ]
    for message, code, why in cases:   # each on its own connection: an AR for the sender closes it
        with hl7.client.MLLPClient("127.0.0.1", port) as client:
            got, control, error = acked(client.send_message(message))
        assert (got, why in error) == (code, True), (message[:60], got, error)
    assert FeedAppointment.select().count() == 0
    # A sender outside the clinic's --hl7-allow: AR, nothing stored.
    configure_feed(org.id, allow=["10.0.0.0/8"])
    with hl7.client.MLLPClient("127.0.0.1", port) as client:
        assert acked(client.send_message(siu("S12", "R9", "C-9")))[0] == "AR"
    assert FeedAppointment.select().count() == 0
    configure_feed(org.id, allow=["127.0.0.0/8"])
    with hl7.client.MLLPClient("127.0.0.1", port) as client:
        assert acked(client.send_message(siu("S12", "R10", "C-10")))[0] == "AA"
    listed = {m["control_id"]: m for m in hl7_messages(settings, org)}
    assert "R1" not in listed, "another facility's message is not this clinic's"
    assert {c: listed[c]["ack"] for c in ("R2", "R3", "R4", "R5", "R6", "R7", "R8", "R9", "R10", "R11", "R12")} == {
        "R2": "AR", "R3": "AR", "R4": "AR", "R5": "AE", "R6": "AE", "R7": "AE", "R8": "AE", "R9": "AR", "R10": "AA",
        "R11": "AE", "R12": "AE"}
    assert all(listed[c]["error"] for c in ("R2", "R5", "R9"))


def test_content_that_cannot_be_stored_is_ae_and_the_connection_stays_usable(runtime, feed_clinic, listen, settings):
    """A duration or start past year 9999, a NUL hidden in an escape (`\\X00\\`): AE with an ERR
    that quotes nothing of the message, nothing stored, and the next message on that connection AA."""
    _, port = listen()
    org = feed_clinic
    cases = [  # (control, message, ERR-2's field)
        ("U1", siu("S12", "U1", "U-1", sch_times=False).replace("|20|MIN|", "|1e7|d|"), "SCH^1^9"),
        ("U2", siu("S12", "U2", "U-2", start="99991231235959", end="").replace("|20|MIN|", "|60|MIN|"),
         "SCH^1^9"),
        ("U3", siu("S12", "U3", "U-3").replace("IM^ROOM 4^^NORTH", "IM^ROOM\\X00\\1^^NORTH"), "AIL^1^3"),
        ("U4", siu("S12", "U4", "U-4").replace("DOE^JANE", "DOE\\X00\\^JANE"), "PID^1^5"),
        ("U5", siu("S17", "U5", "U-\\X00\\5"), "SCH^1^2"),
    ]
    with hl7.client.MLLPClient("127.0.0.1", port) as client:
        for n, (control, message, where) in enumerate(cases):
            reply = client.send_message(message)
            assert reply, f"{control}: the connection was closed without an ACK"
            got, echoed, error = acked(reply)
            assert (got, echoed) == ("AE", control), (control, got, error)
            err = [s for s in hl7.parse(reply[1:-2].decode()) if str(s[0]) == "ERR"][0]
            assert str(err[2]) == where, (control, str(err[2]))
            assert not any(quoted in error for quoted in ("ROOM", "DOE", "9999", "1e7", "U-")), error
            # The same connection serves the next message.
            assert acked(client.send_message(siu("S12", f"OK{n}", f"OK-{n}")))[:2] == ("AA", f"OK{n}")
    assert sorted(a.key for a in FeedAppointment.select()) == [f"OK-{n}" for n in range(len(cases))]
    listed = {m["control_id"]: m for m in hl7_messages(settings, org)}
    assert {c: listed[c]["ack"] for c, *_ in cases} == {c: "AE" for c, *_ in cases}


def _read_ack(sock: socket.socket) -> bytes:
    """One MLLP-framed reply, read whole."""
    reply = b""
    while not reply.endswith(EB):
        chunk = sock.recv(65536)
        assert chunk, reply[:80]
        reply += chunk
    return reply


def test_an_ack_echoes_control_characters_escaped(runtime, feed_clinic, listen):
    """MSH-10 and MSH-3 holding escapes of MLLP's own bytes (`\\X1C\\`, `\\X0B\\`, `\\X1C0D\\`): the
    ACK echoes them as escapes, so it stays one well-formed frame (before, MSA-2 carried a raw
    0x1C 0x0D that ended the ACK early and left bytes outside the framing, on every resend too)."""
    _, port = listen()
    control = "CC\\X1C\\1"
    message = siu("S12", control, "CC-1").replace("|EPIC|", "|EP\\X0B\\IC\\X1C0D\\|", 1)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(15)
        for _ in range(2):   # the first AA, then the resend's (a duplicate)
            sock.sendall(SB + message.encode() + EB)
            reply = _read_ack(sock)
            inner = reply[1:-2]
            assert b"\x0b" not in inner and b"\x1c" not in inner, reply
            assert acked(reply)[:2] == ("AA", control)
            assert str(hl7.parse(inner.decode()).segment("MSH")[5]) == "EP\\X0B\\IC"   # trailing 0x1C 0x0D: blank, trimmed
    assert appointment(feed_clinic, "CC-1") is not None


def test_an_ack_echoing_a_huge_msh_field_stays_small(runtime, feed_clinic, listen):
    """An MSH-3 of almost 1 MiB of 0x01 bytes (each escaped as 5 bytes: `\\X01\\`): the ACK echoes
    its first 227 characters (HL7 v2.5's HD length), so it stays under 2 KiB and parses (before, it
    echoed the whole field: a 5 MiB ACK for a 1 MiB message)."""
    _, port = listen()
    message = siu("S12", "BIG1", "BIG-1").replace("|EPIC|", "|" + "\x01" * (1024 * 1024 - 2048) + "|", 1)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(15)
        sock.sendall(SB + message.encode() + EB)
        reply = _read_ack(sock)
    assert len(reply) < 2048, len(reply)
    assert acked(reply)[:2] == ("AA", "BIG1")
    assert str(hl7.parse(reply[1:-2].decode()).segment("MSH")[5]) == "\\X01\\" * 227


def _closed(sock: socket.socket, timeout: float = 15.0) -> bool:
    """The peer closed the connection (EOF or reset) within `timeout`."""
    sock.settimeout(timeout)
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_a_connection_refused_for_its_sender_is_closed_after_its_ack(runtime, feed_clinic, listen):
    """A message refused for who sent it (an MSH that cannot be read, an MSH-4 naming no clinic, an
    address outside the clinic's --hl7-allow): its AR is written, then the connection is closed (it
    would be refused again; before, it stayed open, so such connections could hold the listener's
    slots). A refusal of what the message is (a type not taken: AR; content: AE) keeps it open."""
    _, port = listen()

    def refused_then_closed(message: str, why: str) -> None:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.settimeout(15)
            sock.sendall(SB + message.encode() + EB)
            got, _, error = acked(_read_ack(sock))
            assert (got, why in error) == ("AR", True), error
            assert _closed(sock, 5), f"still open after AR for {why}"

    refused_then_closed("PID|||1", "MSH")
    refused_then_closed(siu("S12", "SR1", "SR-1", facility="SOMEONE_ELSE"), "MSH-4")
    with hl7.client.MLLPClient("127.0.0.1", port) as client:
        assert acked(client.send_message(siu("A01", "SR2", "SR-2", kind="ADT")))[0] == "AR"
        assert acked(client.send_message(siu("S12", "SR3", "")))[0] == "AE"
        assert acked(client.send_message(siu("S12", "SR4", "SR-4")))[:2] == ("AA", "SR4")
    configure_feed(feed_clinic.id, allow=["10.0.0.0/8"])
    refused_then_closed(siu("S12", "SR5", "SR-5"), "address")
    assert appointment(feed_clinic, "SR-1") is None and appointment(feed_clinic, "SR-5") is None


def test_bad_input_closes_that_connection_only(runtime, feed_clinic, listen):
    _, port = listen(idle=2)
    org = feed_clinic
    bystander = hl7.client.MLLPClient("127.0.0.1", port)  # another interface, connected all along
    served = []

    def bystander_sends() -> None:
        n = len(served)
        served.append(acked(bystander.send_message(siu("S12", f"BY{n}", f"BY-{n}")))[0])

    bystander_sends()
    # Bytes outside the framing, then a whole valid message on the same connection: closed, nothing stored.
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"hello\r" + SB + siu("S12", "F1", "F-1").encode() + EB)
        assert _closed(sock)
    bystander_sends()
    # A message over 1 MiB (its end never read): closed, nothing stored.
    with socket.create_connection(("127.0.0.1", port)) as sock:
        big = siu("S12", "F2", "F-2").replace("ROUTINE^Routine check", "ROUTINE^" + "x" * (1024 * 1024))
        try:
            sock.sendall(SB + big.encode() + EB)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert _closed(sock)
    bystander_sends()
    # A connection silent past SVC_HL7_IDLE_TIMEOUT, in the middle of a message: closed, nothing
    # stored; the bystander is served every 0.5 s while the listener waits on the silent one.
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(SB + siu("S12", "F3", "F-3").encode()[:80])
        began, during = time.monotonic(), len(served)
        sock.settimeout(0.5)
        while True:
            try:
                if sock.recv(65536) == b"":
                    break
            except socket.timeout:
                bystander_sends()
                assert time.monotonic() - began < 30, "the silent connection was never closed"
            except ConnectionResetError:
                break
        assert time.monotonic() - began >= 1.5 and len(served) > during
    # A valid message on a new connection after all of that is served too.
    with hl7.client.MLLPClient("127.0.0.1", port) as client:
        assert acked(client.send_message(siu("S12", "F4", "F-4")))[0] == "AA"
    bystander_sends()
    bystander.close()
    assert appointment(org, "F-1") is None and appointment(org, "F-2") is None and appointment(org, "F-3") is None
    assert not FeedMessage.select().where(FeedMessage.control_id.in_(["F1", "F2", "F3"])).exists()
    assert appointment(org, "F-4") is not None
    assert set(served) == {"AA"} and all(appointment(org, f"BY-{n}") for n in range(len(served)))


def test_a_message_dripped_past_its_deadline_is_cut_off(runtime, feed_clinic, listen):
    """A byte every 0.5 s is never silent for SVC_HL7_IDLE_TIMEOUT (30), yet the message must end
    within SVC_HL7_FRAME_TIMEOUT (2) of its first byte: closed, nothing stored. Between messages
    only the idle timeout applies."""
    _, port = listen(idle=30, SVC_HL7_FRAME_TIMEOUT="2")
    org = feed_clinic
    with hl7.client.MLLPClient("127.0.0.1", port) as bystander:
        assert acked(bystander.send_message(siu("S12", "DR0", "DR-0")))[0] == "AA"
        data = SB + siu("S12", "DR1", "DR-1").encode() + EB
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.settimeout(0.5)
            began, closed = time.monotonic(), False
            for byte in data[:-1]:
                try:
                    sock.sendall(bytes([byte]))
                    closed = sock.recv(65536) == b""
                except socket.timeout:
                    pass
                except (BrokenPipeError, ConnectionResetError):
                    closed = True
                if closed or time.monotonic() - began > 20:
                    break
            took = time.monotonic() - began
        assert closed and 1.5 <= took < 20, (closed, took)
        # The bystander, connected all along and idle between its messages for longer than 2 s.
        assert acked(bystander.send_message(siu("S12", "DR2", "DR-2")))[0] == "AA"
    assert appointment(org, "DR-1") is None and appointment(org, "DR-2") is not None
    assert not FeedMessage.select().where(FeedMessage.control_id == "DR1").exists()


def test_a_sender_that_never_reads_its_acks_is_closed(runtime, feed_clinic, listen, tmp_path):
    """Messages pipelined without reading a single ACK, until the ACKs fill both sockets' buffers
    and the listener's write cannot finish: that write waits at most SVC_HL7_IDLE_TIMEOUT (2 s),
    then the connection is closed, so such connections cannot hold SVC_HL7_MAX_CONNECTIONS (1
    here) against the clinics for ever."""
    _, port = listen(idle=2, SVC_HL7_MAX_CONNECTIONS="1")
    org = feed_clinic
    stuck = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)   # before connect: a small window
    stuck.connect(("127.0.0.1", port))
    stuck.settimeout(1.0)
    # Each answered AR (a type not taken: the connection stays open), never read here; MSH-3, -5
    # and -6 of control characters (5 bytes each when echoed) make each ACK about 4 KB.
    loud = "\x01" * 227
    message = (siu("A01", "RD0", "RD-0", kind="ADT").replace("|EPIC|", f"|{loud}|", 1)
               .replace("|SVCAUTH|HUB|", f"|{loud}|{loud}|", 1))
    burst = (SB + message.encode() + EB) * 100
    try:
        began = time.monotonic()
        while time.monotonic() - began < 60:
            stuck.sendall(burst)   # until the listener stops reading: its ACK's write is blocked
        pytest.fail("the listener kept reading a connection whose ACKs are never read")
    except socket.timeout:
        pass
    # Once the listener's blocked write has waited the idle timeout, the connection is closed.
    wait_until(lambda: _served(port, None, siu("S12", "RD1", "RD-1")), 60, "the stuck connection closed")
    assert "did not read its ACK" in (tmp_path / "hl7-0.log").read_text()
    assert appointment(org, "RD-1") is not None
    stuck.close()


def test_one_peer_cannot_hold_every_connection(runtime, feed_clinic, listen, tmp_path):
    """SVC_HL7_MAX_CONNECTIONS_PER_PEER=2: two silent connections from 127.0.0.3 stay open; a third
    from 127.0.0.3 is closed at once, nothing read or stored (logged); a connection from 127.0.0.2
    is still served and its message applied. Once one of the two closes, 127.0.0.3 is served again."""
    peer = ("127.0.0.3", 0)
    _, port = listen(SVC_HL7_MAX_CONNECTIONS="10", SVC_HL7_MAX_CONNECTIONS_PER_PEER="2")
    held = [socket.create_connection(("127.0.0.1", port), source_address=peer) for _ in range(2)]
    try:
        with socket.create_connection(("127.0.0.1", port), source_address=peer) as third:
            began = time.monotonic()
            try:
                third.sendall(SB + siu("S12", "PP1", "PP-1").encode() + EB)
            except (BrokenPipeError, ConnectionResetError):
                pass
            assert _closed(third) and time.monotonic() - began < 10, "closed at once"
        wait_until(lambda: "SVC_HL7_MAX_CONNECTIONS_PER_PEER" in (tmp_path / "hl7-0.log").read_text(), 30,
                   "the log line")
        replies = asyncio.run(_send_tls(port, None, [siu("S12", "PP2", "PP-2")], source="127.0.0.2"))
        assert acked(replies[0])[:2] == ("AA", "PP2")
        for n, sock in enumerate(held):   # still open: a message on each is answered
            sock.sendall(SB + siu("S12", f"PH{n}", f"PH-{n}").encode() + EB)
            sock.settimeout(15)
            assert acked(_read_ack(sock))[:2] == ("AA", f"PH{n}")
    finally:
        held.pop().close()
    # One slot of 127.0.0.3 freed (once the listener has seen that connection end): served again.
    wait_until(lambda: _served(port, None, siu("S12", "PP3", "PP-3"), source=peer[0]), 30,
               "127.0.0.3 served once one of its connections closed")
    held.pop().close()
    assert appointment(feed_clinic, "PP-1") is None
    assert appointment(feed_clinic, "PP-2") is not None and appointment(feed_clinic, "PP-3") is not None
    assert not FeedMessage.select().where(FeedMessage.control_id == "PP1").exists()


def test_senders_never_proven_hold_at_most_half_the_connections(runtime, feed_clinic, listen, tmp_path):
    """SVC_HL7_MAX_CONNECTIONS=8, SVC_HL7_MAX_CONNECTIONS_PER_PEER=2. The clinic's interface
    (127.0.0.1) sends a message (applied: its address is proven), then disconnects. Silent
    connections from 127.0.0.2 to 127.0.0.5, two each (before: every slot, the clinic locked out),
    take the half left to senders never proven: the first four are kept, the next closed at once
    (logged), as is a new sender's (127.0.0.6), message and all; the clinic's interface still
    connects and its message is applied."""
    _, port = listen(SVC_HL7_MAX_CONNECTIONS="8", SVC_HL7_MAX_CONNECTIONS_PER_PEER="2")
    wait_until(lambda: _served(port, None, siu("S12", "PV1", "PV-1")), 30, "the clinic's first message")
    silent = [socket.create_connection(("127.0.0.1", port), source_address=(f"127.0.0.{2 + n % 4}", 0))
              for n in range(8)]
    try:
        began = time.monotonic()
        assert all(_closed(sock, 10) for sock in silent[4:]) and time.monotonic() - began < 10, "closed at once"
        assert not any(_closed(sock, 0.2) for sock in silent[:4]), "the first four are kept"
        wait_until(lambda: "never proven" in (tmp_path / "hl7-0.log").read_text(), 30, "the log line")
        assert not _served(port, None, siu("S12", "PV2", "PV-2"), source="127.0.0.6")
        replies = asyncio.run(_send_tls(port, None, [siu("S12", "PV3", "PV-3")]))
        assert acked(replies[0])[:2] == ("AA", "PV3")
    finally:
        for sock in silent:
            sock.close()
    assert appointment(feed_clinic, "PV-2") is None and appointment(feed_clinic, "PV-3") is not None


def test_a_peer_is_counted_by_its_address_or_its_ipv6_64():
    """`peer_key` (`ops.addresses.counted_as`) and `Slots`, as units: loopback has one IPv6 address
    (::1), so connections from several addresses of one /64 cannot be made here. A /64 is one peer for
    SVC_HL7_MAX_CONNECTIONS_PER_PEER and for the proven peers remembered (the most recent only)."""
    assert peer_key("2001:db8:1:2::1") == peer_key("2001:db8:1:2:ffff:ffff:ffff:fffe") == "2001:db8:1:2::/64"
    assert peer_key("2001:db8:1:3::1") == "2001:db8:1:3::/64"
    assert peer_key("::ffff:192.0.2.7") == peer_key("192.0.2.7") == "192.0.2.7"
    assert peer_key("fe80::1%eth0") == "fe80::/64" and peer_key("") == ""
    slots = Slots(8, 2, remembered=2)
    held = [slots.take(peer_key(f"2001:db8::{n}")) for n in (1, 2)]
    assert "SVC_HL7_MAX_CONNECTIONS_PER_PEER" in slots.refusal(peer_key("2001:db8::3"))
    assert slots.refusal(peer_key("2001:db8:0:1::3")) is None
    held += [slots.take(f"192.0.2.{n}") for n in (1, 2)]   # four never proven: half of eight
    assert "never proven" in slots.refusal("192.0.2.3")
    for slot in held[:2] + held[3:]:   # 2001:db8::/64 and 192.0.2.2 proven: 192.0.2.1 is left
        slots.prove(slot)
    assert slots.refusal("192.0.2.3") is None and slots.open_unproven() == 1
    slots.prove(slots.take("198.51.100.1"))   # a third proven peer: the first forgotten
    assert list(slots.proven) == ["192.0.2.2", "198.51.100.1"]
    for slot in held:
        slots.release(slot)
    assert (slots.held, slots.unproven) == ({"198.51.100.1": 1}, {})


def test_behind_a_balancer_the_peer_cap_counts_the_client(runtime, world, listen):
    """With --proxy-protocol, SVC_HL7_MAX_CONNECTIONS_PER_PEER counts the address the PROXY header
    names, not the balancer's: two connections of client 127.0.0.2 held, a third closed at once
    before its message is read, while client 127.0.0.3 over the same balancer address is served."""
    org = configure_feed(world.org.id, "siu", FACILITY, [])
    _, port = listen("--proxy-protocol", SVC_TRUSTED_PROXIES="127.0.0.1/32", SVC_HL7_MAX_CONNECTIONS_PER_PEER="2")

    def connect(client: str) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(f"PROXY TCP4 {client} 127.0.0.1 40000 2575\r\n".encode())
        sock.settimeout(15)
        return sock
    held = [connect("127.0.0.2") for _ in range(2)]
    try:
        for n, sock in enumerate(held):
            sock.sendall(SB + siu("S12", f"PX{n}", f"PX-{n}").encode() + EB)
            assert acked(sock.recv(65536))[:2] == ("AA", f"PX{n}")
        with connect("127.0.0.2") as third:
            try:
                third.sendall(SB + siu("S12", "PX2", "PX-2").encode() + EB)
            except (BrokenPipeError, ConnectionResetError):
                pass
            assert _closed(third)
        with connect("127.0.0.3") as other:
            other.sendall(SB + siu("S12", "PX3", "PX-3").encode() + EB)
            assert acked(other.recv(65536))[:2] == ("AA", "PX3")
    finally:
        for sock in held:
            sock.close()
    assert appointment(org, "PX-2") is None and appointment(org, "PX-3") is not None


# -- TLS -----------------------------------------------------------------------------------------

def _certificates(directory):
    """A CA, the listener's certificate (127.0.0.1) and two clients' (CN `clinic interface` and
    `other clinic`), all signed by it; and a client certificate signed by another CA. Returns
    their PEM paths."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    import ipaddress
    now = dt.datetime.now(dt.timezone.utc)

    def make(name, issuer=None, ca=False, san=None):
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        builder = (x509.CertificateBuilder().subject_name(subject)
                   .issuer_name(issuer[0].subject if issuer else subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
                   .not_valid_after(now + dt.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        cert = builder.sign(issuer[1] if issuer else key, hashes.SHA256())
        return cert, key

    def write(name, cert, key=None):
        (directory / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        if key is not None:
            (directory / f"{name}.key").write_bytes(key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        return str(directory / f"{name}.pem"), str(directory / f"{name}.key")

    ca = make("Test CA", ca=True)
    rogue = make("Rogue CA", ca=True)
    paths = {"ca": write("ca", *ca)[0]}
    paths["server"] = write("server", *make("listener", ca, san=[x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]))
    paths["client"] = write("client", *make("clinic interface", ca))
    paths["other"] = write("other", *make("other clinic", ca))
    paths["rogue"] = write("rogue", *make("someone", rogue))
    return paths


async def _send_tls(port, context, messages, source: str | None = None, closed: bool = False) -> list:
    """Each message on one connection (TLS with `context`, plain MLLP with None), from the
    loopback address `source` if given; the replies. `closed`: the listener then closes the
    connection (asserted)."""
    reader, writer = await hl7.mllp.open_hl7_connection(
        "127.0.0.1", port, ssl=context, server_hostname="127.0.0.1" if context else None,
        local_addr=(source, 0) if source else None)
    replies = []
    try:
        for message in messages:
            writer.writemessage(hl7.parse(message))
            await writer.drain()
            replies.append(await asyncio.wait_for(reader.readmessage(), 30))
        if closed:
            assert await asyncio.wait_for(reader.read(65536), 15) == b"", "the listener closed the connection"
    finally:
        writer.close()
    return replies


def _served(port, context, message: str, source: str | None = None) -> bool:
    """`message`, sent on a new connection, was answered AA (False: closed unanswered)."""
    try:
        return acked(asyncio.run(_send_tls(port, context, [message], source))[0])[0] == "AA"
    except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, OSError):
        return False


def _client_context(paths, identity: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=paths["ca"])
    if identity:
        context.load_cert_chain(*paths[identity])
    return context


def test_every_trigger_over_tls_with_client_certificates(runtime, feed_clinic, listen, tmp_path):
    paths = _certificates(tmp_path)
    _, port = listen("--tls-cert", paths["server"][0], "--tls-key", paths["server"][1], "--tls-client-ca", paths["ca"])
    org = feed_clinic
    messages = [siu(t, f"T{n}", "T-1", sent=f"2030030110{n:02d}00") for n, t in
                enumerate(("S12", "S13", "S14", "S15", "S26", "S17"))]
    replies = asyncio.run(_send_tls(port, _client_context(paths, "client"), messages))
    assert [acked(r)[:2] for r in replies] == [("AA", f"T{n}") for n in range(6)]
    assert appointment(org, "T-1").removed
    # Without a client certificate, or with one another CA signed: the handshake fails, nothing stored.
    for identity in (None, "rogue"):
        with pytest.raises((ssl.SSLError, ConnectionResetError, asyncio.IncompleteReadError, OSError)):
            asyncio.run(_send_tls(port, _client_context(paths, identity), [siu("S12", f"X-{identity}", "T-2")]))
    assert appointment(org, "T-2") is None
    # And the listener serves the clinic's interface still.
    replies = asyncio.run(_send_tls(port, _client_context(paths, "client"), [siu("S12", "T9", "T-3")]))
    assert acked(replies[0])[0] == "AA" and appointment(org, "T-3") is not None


def test_connections_over_the_cap_are_closed_at_once(runtime, feed_clinic, listen, tmp_path):
    """SVC_HL7_MAX_CONNECTIONS=2 (all of them allowed to one address here), held by a clinic's
    served connection and one that never finishes its TLS handshake: a third is closed at once
    (logged), not served; once the idle timeout (5 s) closed those two, a connection is served again."""
    paths = _certificates(tmp_path)
    _, port = listen("--tls-cert", paths["server"][0], "--tls-key", paths["server"][1], "--tls-client-ca", paths["ca"],
                     idle=5, SVC_HL7_MAX_CONNECTIONS="2", SVC_HL7_MAX_CONNECTIONS_PER_PEER="2")
    context = _client_context(paths, "client")
    # Its address proven by a first message (retried: the start-up probe's connection may still
    # hold the one slot of senders never proven), so its stalled connection below is taken.
    wait_until(lambda: _served(port, context, siu("S12", "CAPP", "CAP-P")), 30, "a first message served")

    async def over_the_cap() -> None:
        reader, writer = await hl7.mllp.open_hl7_connection("127.0.0.1", port, ssl=context)
        stalled = None
        try:
            writer.writemessage(hl7.parse(siu("S12", "CAP0", "CAP-0")))
            await writer.drain()
            assert acked(await asyncio.wait_for(reader.readmessage(), 30))[0] == "AA"
            stalled = socket.create_connection(("127.0.0.1", port))   # no ClientHello, ever
            began = time.monotonic()
            with pytest.raises((ssl.SSLError, ConnectionResetError, asyncio.IncompleteReadError, OSError)):
                await _send_tls(port, context, [siu("S12", "CAP1", "CAP-1")])
            assert time.monotonic() - began < 4, "closed at once, not by the idle timeout"
            assert _closed(stalled), "an unfinished handshake ends with the idle timeout"
        finally:
            writer.close()
            if stalled is not None:
                stalled.close()
    asyncio.run(over_the_cap())
    wait_until(lambda: "SVC_HL7_MAX_CONNECTIONS" in (tmp_path / "hl7-0.log").read_text(), 30, "the log line")
    replies = asyncio.run(_send_tls(port, context, [siu("S12", "CAP2", "CAP-2")]))
    assert acked(replies[0])[0] == "AA"
    assert appointment(feed_clinic, "CAP-1") is None and appointment(feed_clinic, "CAP-2") is not None


def test_a_clinic_bound_to_client_certificates_takes_only_theirs(runtime, world, feed_clinic, listen, settings,
                                                                 tmp_path):
    """`--hl7-client-subject`: the clinic's messages are applied only over a connection whose
    client certificate (signed by --tls-client-ca) has one of those subject CNs; another clinic's
    certificate from the same CA, or no certificate (plain MLLP), is AR, nothing stored. A clinic
    without the setting takes any certificate the CA signed."""
    from lifecycle.organizations import create_organization
    code, shown = cli_json(settings, "orgs", "update", "--org", feed_clinic.id, "--hl7-client-subject",
                           "clinic interface, backup interface", "--hl7-client-subject", "clinic interface", "--json")
    assert code == 0 and shown["hl7_client_subjects"] == ["clinic interface", "backup interface"], shown
    code, shown = cli_json(settings, "orgs", "show", "--org", feed_clinic.id, "--json")
    assert shown["hl7_client_subjects"] == ["clinic interface", "backup interface"]
    code, error = cli_json(settings, "orgs", "update", "--org", feed_clinic.id, "--hl7-client-subject", "bad\tname")
    assert code == 2 and "--hl7-client-subject" in error
    unbound = create_organization("Unbound Clinic")
    configure_feed(unbound.id, "siu", "UNBOUND", [])
    paths = _certificates(tmp_path)
    _, port = listen("--tls-cert", paths["server"][0], "--tls-key", paths["server"][1], "--tls-client-ca", paths["ca"])
    own, other = _client_context(paths, "client"), _client_context(paths, "other")
    # Another clinic's certificate names this clinic's facility: AR, and the connection is closed
    # (it would be refused again); a new connection's message for its own (unbound) clinic is applied.
    replies = asyncio.run(_send_tls(port, other, [siu("S12", "B1", "B-1")], closed=True))
    assert acked(replies[0])[0] == "AR" and "client certificate" in acked(replies[0])[2]
    replies = asyncio.run(_send_tls(port, other, [siu("S12", "B2", "B-2", facility="UNBOUND")]))
    assert acked(replies[0])[0] == "AA"
    replies = asyncio.run(_send_tls(port, own, [siu("S12", "B3", "B-3")]))
    assert acked(replies[0])[0] == "AA"
    # Without TLS there is no certificate: AR.
    _, plain = listen()
    with hl7.client.MLLPClient("127.0.0.1", plain) as client:
        assert acked(client.send_message(siu("S12", "B4", "B-4")))[0] == "AR"
    assert appointment(feed_clinic, "B-1") is None and appointment(feed_clinic, "B-4") is None
    assert appointment(feed_clinic, "B-3") is not None and appointment(unbound, "B-2") is not None
    assert {m["control_id"]: m["ack"] for m in hl7_messages(settings, feed_clinic)} == {"B1": "AR", "B3": "AA",
                                                                                        "B4": "AR"}
    # '' clears the list: any certificate (or none) again.
    code, shown = cli_json(settings, "orgs", "update", "--org", feed_clinic.id, "--hl7-client-subject", "", "--json")
    assert code == 0 and shown["hl7_client_subjects"] == []
    with hl7.client.MLLPClient("127.0.0.1", plain) as client:
        assert acked(client.send_message(siu("S12", "B5", "B-5")))[0] == "AA"


def test_plain_mllp_is_refused_by_a_tls_listener(runtime, feed_clinic, listen, tmp_path):
    paths = _certificates(tmp_path)
    _, port = listen("--tls-cert", paths["server"][0], "--tls-key", paths["server"][1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(SB + siu("S12", "P1", "P-1").encode() + EB)
        assert _closed(sock)
    assert appointment(feed_clinic, "P-1") is None
    replies = asyncio.run(_send_tls(port, _client_context(paths, None), [siu("S12", "P2", "P-2")]))
    assert acked(replies[0])[0] == "AA"



def test_a_tls_file_the_listener_cannot_read_is_named_at_start(settings, tmp_path):
    """The shipped unit names three files (docs/hl7-feed.md): one missing, or not PEM, stops the
    listener with one line naming its option and path, not a bare "[Errno 2] No such file"."""
    paths = _certificates(tmp_path)
    (tmp_path / "garbage.pem").write_text("not a certificate")
    cert, key = paths["server"]
    missing, garbage = str(tmp_path / "missing.pem"), str(tmp_path / "garbage.pem")
    cases = [(["--tls-cert", missing, "--tls-key", key], "--tls-cert"),
             (["--tls-cert", cert, "--tls-key", missing], "--tls-key"),
             (["--tls-cert", cert, "--tls-key", key, "--tls-client-ca", missing], "--tls-client-ca"),
             (["--tls-cert", garbage, "--tls-key", key], "--tls-cert"),
             (["--tls-cert", cert, "--tls-key", key, "--tls-client-ca", garbage], "--tls-client-ca")]
    for flags, option in cases:
        out = subprocess.run([sys.executable, "-m", "cli.__main__", "hl7", "listen", "--port", str(free_port()), *flags],
                             env=settings_env(settings), cwd=str(ROOT), capture_output=True, text=True, timeout=60)
        path = flags[flags.index(option) + 1]
        assert out.returncode == 2 and out.stderr.count("\n") == 1, (flags, out.stderr)
        assert f"{option} {path}" in out.stderr, (flags, out.stderr)


# -- behind a TCP load balancer (HAProxy, the PROXY protocol) ----------------------------------------

@pytest.fixture
def balancer(tmp_path):
    """`balancer(port, "send-proxy" | "send-proxy-v2")` -> the port of a real HAProxy in TCP mode
    that forwards to `port` with a PROXY header of that version (Debian's haproxy; HAProxy's spec:
    https://www.haproxy.org/download/2.6/doc/proxy-protocol.txt)."""
    procs = []

    def start(backend: int, option: str) -> int:
        front = free_port()
        config = tmp_path / f"haproxy-{len(procs)}.cfg"
        config.write_text(f"""defaults
  mode tcp
  timeout connect 5s
  timeout client 60s
  timeout server 60s
frontend feed
  bind 127.0.0.1:{front}
  default_backend listener
backend listener
  server hl7 127.0.0.1:{backend} {option}
""")
        proc = subprocess.Popen(["haproxy", "-db", "-f", str(config)], stdout=subprocess.DEVNULL,
                                stderr=open(tmp_path / f"haproxy-{len(procs)}.log", "wb"))
        procs.append(proc)
        wait_for_port(front, proc=proc)
        return front
    yield start
    for proc in procs:
        stop_process(proc)


@pytest.mark.parametrize("option", ["send-proxy", "send-proxy-v2"])
def test_behind_a_balancer_the_allow_list_sees_the_client(runtime, world, listen, balancer, option, tmp_path):
    """`hl7 listen --proxy-protocol` behind HAProxy: the clinic's `--hl7-allow` is checked against
    the address HAProxy's PROXY header names (v1 and v2), not HAProxy's own; a connection from
    outside SVC_TRUSTED_PROXIES, or without a header, is closed with nothing stored. TLS with client
    certificates passes through the balancer as before."""
    org = configure_feed(world.org.id, "siu", FACILITY, ["127.0.0.2/32"])
    paths = _certificates(tmp_path)
    _, port = listen("--proxy-protocol", "--tls-cert", paths["server"][0], "--tls-key", paths["server"][1],
                     "--tls-client-ca", paths["ca"], SVC_TRUSTED_PROXIES="127.0.0.1/32")
    front = balancer(port, option)
    own = _client_context(paths, "client")
    replies = asyncio.run(_send_tls(front, own, [siu("S12", "L1", "L-1")], source="127.0.0.2"))
    assert acked(replies[0])[:2] == ("AA", "L1")
    replies = asyncio.run(_send_tls(front, own, [siu("S12", "L2", "L-2")], source="127.0.0.3"))
    assert acked(replies[0])[0] == "AR" and "address" in acked(replies[0])[2]
    # Straight to the listener: from outside SVC_TRUSTED_PROXIES, or from it with no header.
    for source in ("127.0.0.2", "127.0.0.1"):
        with pytest.raises((ssl.SSLError, ConnectionResetError, asyncio.IncompleteReadError, OSError)):
            asyncio.run(_send_tls(port, own, [siu("S12", f"D-{source}", "L-3")], source=source))
    assert appointment(org, "L-1") is not None
    assert appointment(org, "L-2") is None and appointment(org, "L-3") is None
    # Plain MLLP behind the balancer; and without --proxy-protocol the listener sees only the
    # balancer's address, so the list refuses the clinic's own interface.
    _, plain = listen("--proxy-protocol", SVC_TRUSTED_PROXIES="127.0.0.1/32")
    replies = asyncio.run(_send_tls(balancer(plain, option), None, [siu("S12", "L4", "L-4")], source="127.0.0.2"))
    assert acked(replies[0])[:2] == ("AA", "L4")
    _, unaware = listen()
    replies = asyncio.run(_send_tls(balancer(unaware, ""), None, [siu("S12", "L5", "L-5")], source="127.0.0.2"))
    assert acked(replies[0])[0] == "AR"


def test_a_malformed_proxy_header_closes_the_connection_unread(runtime, world, listen):
    """From a trusted balancer address, headers an attacker might forge or garble: each connection
    is closed with nothing stored, and the listener serves the next one."""
    org = configure_feed(world.org.id, "siu", FACILITY, ["127.0.0.2/32"])
    _, port = listen("--proxy-protocol", SVC_TRUSTED_PROXIES="127.0.0.1/32")
    message = SB + siu("S12", "H1", "H-1").encode() + EB
    v2 = b"\r\n\r\n\x00\r\nQUIT\n"
    for header in (b"PROXY TCP4 127.0.0.2 999.0.0.1 1000 2575\r\n",      # not an address
                   b"PROXY TCP6 127.0.0.2 127.0.0.1 1000 2575\r\n",      # the wrong family
                   b"PROXY TCP4 127.0.0.2 127.0.0.1 1000 99999\r\n",     # not a port
                   b"PROXY TCP4 " + b"1" * 200 + b"\r\n",                  # over 107 bytes
                   b"PROXY \x00TCP4 127.0.0.2 127.0.0.1 1000 2575\r\n",  # a NUL
                   v2 + b"\x21\x11\xff\xff",                              # 65,535 bytes announced
                   v2 + b"\x31\x11\x00\x0c" + bytes(12),                 # version 3
                   v2 + b"\x21\x11\x00\x04" + bytes(4)):                 # shorter than its addresses
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(header + message)
            assert _closed(sock), header
    assert appointment(org, "H-1") is None
    with socket.create_connection(("127.0.0.1", port)) as sock:  # a well-formed one, written by hand
        sock.sendall(b"PROXY TCP4 127.0.0.2 127.0.0.1 40000 2575\r\n" + message)
        sock.settimeout(15)
        assert acked(sock.recv(65536))[:2] == ("AA", "H1")


def test_the_proxy_protocol_needs_trusted_proxies(settings):
    out = subprocess.run([sys.executable, "-m", "cli.__main__", "hl7", "listen", "--proxy-protocol", "--port",
                          str(free_port())], env=settings_env(settings), cwd=str(ROOT), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "SVC_TRUSTED_PROXIES" in out.stderr, out.stderr


# -- kill -9 and several listeners ------------------------------------------------------------------

class Sender(threading.Thread):
    """Sends its own messages one after another on one connection until the listener dies;
    `acknowledged` holds the control ids answered AA, `in_flight` the one sent and never answered."""

    def __init__(self, port: int, name: str, count: int):
        super().__init__(daemon=True)
        self.port, self.prefix, self.count = port, name, count
        self.acknowledged: list[str] = []
        self.in_flight: str | None = None

    def run(self) -> None:
        try:
            client = hl7.client.MLLPClient("127.0.0.1", self.port)
            for n in range(self.count):
                control = f"{self.prefix}-{n}"
                self.in_flight = control
                reply = client.send_message(siu("S12", control, f"K-{control}"))
                if not reply:
                    return
                assert acked(reply)[:2] == ("AA", control)
                self.acknowledged.append(control)
                self.in_flight = None
        except OSError:
            return


def test_kill_9_loses_no_acknowledged_message(runtime, feed_clinic, listen):
    proc, port = listen()
    senders = [Sender(port, f"S{i}", 10_000) for i in range(4)]
    for sender in senders:
        sender.start()
    deadline = time.monotonic() + 120
    while sum(len(s.acknowledged) for s in senders) < 200 and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)  # while every sender has a message on the wire
    proc.wait()
    for sender in senders:
        sender.join(30)
    acknowledged = [c for s in senders for c in s.acknowledged]
    in_flight = [s.in_flight for s in senders if s.in_flight]
    assert len(acknowledged) >= 200
    assert in_flight, "the kill landed while messages were sent and not yet acknowledged"
    stored = {m.control_id for m in FeedMessage.select().where(FeedMessage.first)}
    assert set(acknowledged) <= stored, "every acknowledged message survived the kill"
    # The senders send their unacknowledged message again, to a new listener: each is applied once.
    _, port = listen()
    with hl7.client.MLLPClient("127.0.0.1", port) as client:
        for control in in_flight:
            assert acked(client.send_message(siu("S12", control, f"K-{control}")))[0] == "AA"
            assert acked(client.send_message(siu("S12", control, f"K-{control}")))[0] == "AA"
    for control in acknowledged + in_flight:
        assert FeedMessage.select().where((FeedMessage.control_id == control) & FeedMessage.first).count() == 1
        assert appointment(feed_clinic, f"K-{control}") is not None


def test_two_listeners_on_one_database_apply_a_message_once(runtime, feed_clinic, listen):
    (_, first), (_, second) = listen(), listen()
    clients = [hl7.client.MLLPClient("127.0.0.1", first), hl7.client.MLLPClient("127.0.0.1", second)]
    for n in range(20):
        # The same message to both listeners at once; then an older one for the same appointment.
        message = siu("S12", f"W{n}", f"W-{n}", sent="20300301120000")
        gate = threading.Barrier(2)
        replies = [None, None]

        def send(i):
            gate.wait()
            replies[i] = clients[i].send_message(message)
        threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert [acked(r)[:2] for r in replies] == [("AA", f"W{n}")] * 2
        assert FeedMessage.select().where((FeedMessage.control_id == f"W{n}") & FeedMessage.first).count() == 1
        assert FeedMessage.select().where(FeedMessage.control_id == f"W{n}").count() == 2
    # Two messages of one appointment, to two listeners at once: the newer one wins either way.
    newer = siu("S13", "V1", "W-0", sent="20300301130000", start="20300310090000", end="20300310093000")
    older = siu("S13", "V2", "W-0", sent="20300301125900", start="20300311090000", end="20300311093000")
    threads = [threading.Thread(target=clients[i].send_message, args=(m,)) for i, m in enumerate((older, newer))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert appointment(feed_clinic, "W-0").start == dt.datetime(2030, 3, 10, 9, 0)
    for client in clients:
        client.close()


# -- the night -----------------------------------------------------------------------------------------

def test_the_night_of_a_siu_clinic_is_built_from_the_feed(runtime, world, feed_clinic, listen):
    start = night_window(runtime.settings, NIGHT)[0]
    runtime.clock.advance((start - dt.timedelta(hours=6) - runtime.clock.now()).total_seconds())
    record_platform_verification(runtime, world.app, world.physician)
    record_activity(runtime, world.physician)
    _, port = listen()

    def hl7_time(when: dt.datetime) -> str:
        return when.strftime("%Y%m%d%H%M%S")
    inside = start + dt.timedelta(days=2, hours=7)
    cases = {  # key: (start, status, npi, mrn)
        "N-in": (inside, "Booked", "1234567893", "E1"),
        "N-pending": (inside + dt.timedelta(hours=1), "Pending", "1234567893", "E2"),
        "N-cancelled": (inside, "Cancelled", "1234567893", "E3"),
        "N-before": (start - dt.timedelta(hours=1), "Booked", "1234567893", "E4"),
        "N-after": (start + dt.timedelta(days=10, minutes=1), "Booked", "1234567893", "E5"),
        "N-other-doctor": (inside, "Booked", "1245319599", "E6"),
    }
    with hl7.client.MLLPClient("127.0.0.1", port) as client:
        for n, (key, (when, status, npi, mrn)) in enumerate(cases.items()):
            reply = client.send_message(siu("S12", f"N{n}", key, start=hl7_time(when),
                                            end=hl7_time(when + dt.timedelta(minutes=30)), status=status, npi=npi,
                                            mrn=mrn))
            assert acked(reply)[0] == "AA"
    snapshot = build_snapshot(runtime, world.org.id, NIGHT)
    rows = list(SnapshotAppointment.select().where(SnapshotAppointment.snapshot == snapshot.id)
                .order_by(SnapshotAppointment.start))
    assert [r.ehr_appointment_id for r in rows] == ["N-in", "N-pending"]
    assert {r.provider_id for r in rows} == {world.physician.id}
    first = rows[0]
    assert (first.status, first.patient_last_name, first.patient_date_of_birth, first.patient_sex) == (
        "booked", "DOE", dt.date(1980, 1, 1), "female")
    assert first.patient_id.startswith("pat-") and first.patient_id != rows[1].patient_id
    # The same identifier is the same patient, night after night.
    again = build_snapshot(runtime, world.org.id, NIGHT)
    assert SnapshotAppointment.get((SnapshotAppointment.snapshot == again.id)
                                   & (SnapshotAppointment.ehr_appointment_id == "N-in")).patient_id == first.patient_id


@pytest.fixture(scope="module")
def open_fhir_ehr():
    """The test EHR (tests/js/fhir_ehr.mjs) without authentication, for a feed clinic on `--ehr fhir`."""
    ehr = start_fhir_ehr("--open")
    yield ehr
    ehr.proc.terminate()
    ehr.proc.wait(timeout=10)


def test_a_fhir_clinics_feed_patients_are_the_ehrs_patients(runtime, world, listen, open_fhir_ehr):
    from connectors import Bounds, connector_for
    from lifecycle.applications import install_application
    from lifecycle.organizations import create_organization
    from lifecycle.users import create_user
    open_fhir_ehr.admin("reset", {})
    twin = patient("pt-twin", "Roe", "Rick", "1955-06-30", "male")
    twin["identifier"] = [{"system": "http://hospital.example/mrn", "value": "MRN-dup"}]
    other = patient("pt-other", "Poe", "Ann", "1960-01-01", "female")
    other["identifier"] = [{"system": "http://hospital.example/mrn", "value": "MRN-dup"}]
    born = patient("pt-born", "Loe", "Lee", "1980-01-01", "female")  # siu()'s PID-7
    born["identifier"] = [{"system": "http://lab.example/id", "value": "LAB-7"}]
    open_fhir_ehr.seed(patient("pt-1", "Doe", "Jane", "1970-01-02", "female"), twin, other, born)
    clinic = create_organization("FHIR Feed Clinic", "fhir", open_fhir_ehr.base, fhir_auth="none")
    doctor = create_user(clinic.id, "feed-doc@example.com", "Feed", "Doc", "fdoc", "1245319599")
    install_application(world.app.id, clinic.id)
    configure_feed(clinic.id, "siu", "FHIR_FEED", [])
    start = night_window(runtime.settings, NIGHT)[0]
    runtime.clock.advance((start - dt.timedelta(hours=6) - runtime.clock.now()).total_seconds())
    record_platform_verification(runtime, world.app, doctor)
    record_activity(runtime, doctor)
    _, port = listen()
    when = (start + dt.timedelta(days=1, hours=8)).strftime("%Y%m%d%H%M%S")
    mrn = "^^^&http://hospital.example/mrn&URI^MR"
    with hl7.client.MLLPClient("127.0.0.1", port) as client:
        # H4, H5: CX.4 a namespace, not a system: the value in any system, of a Patient born on PID-7's
        # date (pt-1 has MRN-pt-1 but another birth date: not taken for the patient the EHR lacks).
        for control, key, pid3 in (("H1", "H-known", "MRN-pt-1" + mrn), ("H2", "H-unknown", "MRN-nobody" + mrn),
                                   ("H3", "H-twice", "MRN-dup" + mrn), ("H4", "H-other-born", "MRN-pt-1^^^EPI^MR"),
                                   ("H5", "H-born", "LAB-7^^^EPI^MR")):
            reply = client.send_message(siu("S12", control, key, facility="FHIR_FEED", npi="1245319599", pid3=pid3,
                                            start=when, end=when[:-4] + "3000"))
            assert acked(reply)[0] == "AA"
    snapshot = build_snapshot(runtime, clinic.id, NIGHT)
    rows = list(SnapshotAppointment.select().where(SnapshotAppointment.snapshot == snapshot.id))
    assert sorted((r.ehr_appointment_id, r.patient_id) for r in rows) == [("H-born", "pt-born"), ("H-known", "pt-1")]
    assert json.loads(snapshot.skipped) == {
        "patient identifier names several Patients in the EHR": {"count": 1, "appointments": ["H-twice"]},
        "patient not found in the EHR": {"count": 2, "appointments": ["H-other-born", "H-unknown"]}}
    # The id is the EHR's: its chart is read from the EHR.
    known = next(r.patient_id for r in rows if r.ehr_appointment_id == "H-known")
    chart = connector_for(runtime, clinic, Bounds.batch(runtime.settings)).fetch_chart(known)
    assert (chart.patient.id, chart.patient.last_name) == ("pt-1", "Doe")


def cli_json(settings, *args) -> tuple[int, dict | str]:
    out = subprocess.run([sys.executable, "-m", "cli.__main__", *args], env=settings_env(settings), cwd=str(ROOT),
                         capture_output=True, text=True, timeout=180)
    return out.returncode, (json.loads(out.stdout) if out.returncode == 0 else out.stderr)


def test_a_clinics_feed_settings_on_the_command_line(runtime, world, settings):
    code, org = cli_json(settings, "orgs", "create", "--name", "Feed Clinic", "--schedule-source", "siu",
                         "--hl7-facility", "SOUTH", "--hl7-allow", "203.0.113.0/24", "10.1.2.3", "--json")
    assert code == 0 and (org["schedule_source"], org["hl7_facility"], org["hl7_allow"]) == (
        "siu", "SOUTH", ["203.0.113.0/24", "10.1.2.3/32"])
    code, shown = cli_json(settings, "orgs", "show", "--org", org["id"], "--json")
    assert (shown["schedule_source"], shown["hl7_facility"], shown["hl7_allow"]) == (
        "siu", "SOUTH", ["203.0.113.0/24", "10.1.2.3/32"])
    # One clinic per facility; a bad network; `siu` without a facility: exit 2 naming why, nothing made.
    code, error = cli_json(settings, "orgs", "create", "--name", "Twin", "--hl7-facility", "SOUTH", "--json")
    assert code == 2 and "another organization's" in error
    code, error = cli_json(settings, "orgs", "update", "--org", org["id"], "--hl7-allow", "10.0.0.300/8", "--json")
    assert code == 2 and "--hl7-allow" in error
    code, error = cli_json(settings, "orgs", "create", "--name", "No facility", "--schedule-source", "siu", "--json")
    assert code == 2 and "--hl7-facility" in error
    code, orgs = cli_json(settings, "orgs", "list", "--json")
    assert {o["name"] for o in orgs} == {world.org.name, "Feed Clinic"}
    # Back to the connector's pull; the allowed list emptied (any address).
    code, updated = cli_json(settings, "orgs", "update", "--org", org["id"], "--schedule-source", "ehr", "--hl7-allow",
                             "--json")
    assert code == 0 and (updated["schedule_source"], updated["hl7_facility"], updated["hl7_allow"]) == (
        "ehr", "SOUTH", [])
    code, default = cli_json(settings, "orgs", "show", "--org", world.org.id, "--json")
    assert (default["schedule_source"], default["hl7_facility"], default["hl7_allow"]) == ("ehr", None, [])
    # `hl7 messages --limit` past what the database counts in (a 64-bit LIMIT): exit 2 naming the
    # flag, not a traceback of the driver's overflow.
    for limit in (str(2 ** 64), "0", "10001"):
        code, error = cli_json(settings, "hl7", "messages", "--org", org["id"], "--limit", limit, "--json")
        assert code == 2 and "--limit" in error and "Traceback" not in error, (limit, error)
    code, listed = cli_json(settings, "hl7", "messages", "--org", org["id"], "--limit", "10000", "--json")
    assert code == 0 and listed == []


def test_retention_removes_what_no_snapshot_needs(runtime, world, feed_clinic, listen):
    from hl7feed.store import prune
    _, port = listen(SVC_CLOCK_OFFSET="0")
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None, microsecond=0)

    def hl7_time(when: dt.datetime) -> str:
        return when.strftime("%Y%m%d%H%M%S")
    with hl7.client.MLLPClient("127.0.0.1", port) as client:
        for control, key, when in (("O1", "O-past", now - dt.timedelta(days=3)),
                                   ("O2", "O-soon", now + dt.timedelta(days=5))):
            assert acked(client.send_message(siu("S12", control, key, start=hl7_time(when),
                                                 end=hl7_time(when + dt.timedelta(minutes=20)))))[0] == "AA"
        # An appointment without an NPI physician is kept without its patient.
        assert acked(client.send_message(siu("S12", "O3", "O-nobody", xcn="400^BEST^TINA")))[0] == "AA"
    nobody = appointment(feed_clinic, "O-nobody")
    assert (nobody.physician_npi, nobody.patient_identifier, nobody.patient_last_name) == ("", "", "")
    # Ended more than 2 days ago: gone; message records stay 90 days.
    assert prune(runtime, now) == (1, 0)
    assert appointment(feed_clinic, "O-past") is None and appointment(feed_clinic, "O-soon") is not None
    assert prune(runtime, now + dt.timedelta(days=91)) == (1, 3)
    assert not FeedMessage.select().exists() and appointment(feed_clinic, "O-nobody") is not None


def test_the_hub_lists_the_feeds_schedule_as_the_night_does(runtime, world, feed_clinic, live, settings):
    """A clinic on the SIU feed: the physician's hub page listed what the clinic's EHR connector
    answered (the sandbox EHR's own made-up schedule here; on Epic without `--epic-user-id`, an error
    on every page), not the feed's schedule that the night and the API serve: the hub went around
    the one schedule-source interface. It now reads the clinic's schedule source, as the night does."""
    from hl7feed.store import receive

    now = runtime.clock.now().replace(tzinfo=None)
    when = now.replace(microsecond=0) + dt.timedelta(days=1)
    stamp = lambda moment: moment.strftime("%Y%m%d%H%M%S")  # noqa: E731
    message = siu("S12", "HUB-1", "HUBKEY1", sent=stamp(now - dt.timedelta(minutes=1)), start=stamp(when),
                  end=stamp(when + dt.timedelta(minutes=20)), npi=world.physician.npi)
    outcome = receive(runtime, message.replace("DOE^JANE", "ZEBRA^QUINCY").encode(), "127.0.0.1")
    assert outcome.ack == "AA" and outcome.change == "applied", outcome

    page = hub_page_at(settings, live, world.physician.id, timeout=30)
    assert "ZEBRA" in page.upper() and "QUINCY" in page.upper(), page


def test_a_start_block_inside_a_message_is_a_framing_error(runtime, feed_clinic, listen):
    """A message cut off (an engine that gave up writing it) then a whole one on the same connection:
    `0x0B` part of M1 `0x0B` M2 `0x1C 0x0D`. MLLP content never holds 0x0B, so the second start block
    is a framing error: closed, no ACK, nothing stored (before, the two were read as one message: M1's
    header and segments with M2's appended, acknowledged AA for M1, and M1's appointment stored with
    M2's physician, the one of the only whole AIP segment: another physician's snapshot listed it)."""
    _, port = listen()
    first = siu("S12", "SPL1", "SPL-1", npi="1234567893", mrn="E1")
    cut = first[:first.index("AIP|1||") + len("AIP|1||")]
    second = siu("S12", "SPL2", "SPL-2", npi="1245319599", mrn="E2")
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(SB + cut.encode() + SB + second.encode() + EB)
        assert _closed(sock), "the spliced frame was read as a message"
    assert appointment(feed_clinic, "SPL-1") is None and appointment(feed_clinic, "SPL-2") is None
    assert not FeedMessage.select().where(FeedMessage.control_id.in_(["SPL1", "SPL2"])).exists()
    # The engine reconnects and sends the message again: applied.
    with hl7.client.MLLPClient("127.0.0.1", port) as client:
        assert acked(client.send_message(second))[:2] == ("AA", "SPL2")
    assert appointment(feed_clinic, "SPL-2").physician_npi == "1245319599"


def test_a_line_feed_inside_a_field_does_not_split_its_segment(runtime, feed_clinic, listen, settings):
    """Segments end with CR; an EHR that leaves a line feed unescaped in a text (a reason typed on two
    lines) sends it inside its field. It stays in that field: the message is applied, and the
    connection stays open (before, the LF was taken for a segment end, the rest of SCH for a segment
    whose name is not one, and the message refused AR as an MSH that cannot be read, unlisted in
    `hl7 messages`, its connection closed: the clinic's feed stopped on it)."""
    _, port = listen()
    message = siu("S12", "LF1", "LF-1").replace("FOLLOWUP^Follow-up", "FOLLOWUP^Follow-up\nin two weeks")
    with hl7.client.MLLPClient("127.0.0.1", port) as client:
        assert acked(client.send_message(message))[:2] == ("AA", "LF1")
        assert acked(client.send_message(siu("S12", "LF2", "LF-2")))[:2] == ("AA", "LF2")
    row = appointment(feed_clinic, "LF-1")
    assert row.status == "booked" and row.reason.startswith("Follow-up") and row.physician_npi == "1234567893"
    # A message whose segments end with LF only (or CRLF) is still read, as before.
    with hl7.client.MLLPClient("127.0.0.1", port) as client:
        assert acked(client.send_message(siu("S12", "LF3", "LF-3").replace("\r", "\n")))[:2] == ("AA", "LF3")
        assert acked(client.send_message(siu("S12", "LF4", "LF-4").replace("\r", "\r\n")))[:2] == ("AA", "LF4")
    assert appointment(feed_clinic, "LF-3").physician_npi == appointment(feed_clinic, "LF-4").physician_npi == "1234567893"


def test_a_malformed_segment_after_msh_is_ae_for_the_clinic(runtime, feed_clinic, listen, settings):
    """A message whose MSH reads well (a clinic's facility, a sender it takes) but with a later
    segment whose name is not one (`Z1|...`, `pid|...`): its content cannot be applied, so AE, listed
    in `hl7 messages`, and the connection stays open for the next message (before: AR as an MSH that
    cannot be read, the connection closed, and nothing in the clinic's list)."""
    _, port = listen()
    with hl7.client.MLLPClient("127.0.0.1", port) as client:
        got, control, error = acked(client.send_message(siu("S12", "BS1", "BS-1") + "\rz1|garbage"))
        assert (got, control) == ("AE", "BS1"), error
        assert acked(client.send_message(siu("S12", "BS2", "BS-2")))[:2] == ("AA", "BS2")
    assert appointment(feed_clinic, "BS-1") is None
    listed = {m["control_id"]: m for m in hl7_messages(settings, feed_clinic)}
    assert listed["BS1"]["ack"] == "AE" and listed["BS1"]["error"]


def test_the_frame_deadline_is_each_messages_own(runtime, feed_clinic, listen):
    """SVC_HL7_FRAME_TIMEOUT (2) counts from a message's own first bytes: a sender whose writes each
    end one message and begin the next (messages sent back to back, a write every 0.3 s, each message
    whole well within 2 s of its first byte) is served to the end (before, the deadline of the
    first message that began was kept while every later one began in the read that ended the one
    before: the connection was closed 2 s in, with a message begun a moment earlier)."""
    _, port = listen(idle=30, SVC_HL7_FRAME_TIMEOUT="2")
    framed = [SB + siu("S12", f"BB{n}", f"BB-{n}").encode() + EB for n in range(16)]
    stream = b"".join(framed)
    size = len(framed[0])
    pieces = [stream[i:i + size] for i in range(0, len(stream), size)]
    pieces = [pieces[0][:size // 2]] + [a[size // 2:] + b[:size // 2] for a, b in zip(pieces, pieces[1:])] + \
        [pieces[-1][size // 2:]]
    replies = b""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(0.3)
        for piece in pieces:
            try:
                sock.sendall(piece)
                time.sleep(0.3)
                replies += sock.recv(65536)
            except socket.timeout:
                pass
            except (BrokenPipeError, ConnectionResetError):
                break
        sock.settimeout(10)
        while replies.count(EB) < len(framed):
            chunk = sock.recv(65536)
            assert chunk, f"closed after {replies.count(EB)} ACKs of {len(framed)}"
            replies += chunk
    assert [acked(SB + r + EB)[:2] for r in replies[1:-2].split(EB + SB)] == [("AA", f"BB{n}") for n in range(16)]
    assert all(appointment(feed_clinic, f"BB-{n}") for n in range(16))


def test_msa2_is_the_whole_control_id_or_the_message_is_refused(runtime, feed_clinic, listen, settings):
    """MSA-2 is the message's MSH-10 (CONTRACTS.md), which an engine matches to know what was
    acknowledged: a control id of 199 characters (HL7's longest) is echoed whole; one of 200 is
    refused AR, nothing stored (before, it was applied AA with an MSA-2 cut to 199 characters, which
    matched nothing the engine sent: it waited for an ACK it never got, resending for ever)."""
    _, port = listen()
    longest, over = "L" * 198 + "1", "L" * 199 + "2"
    with hl7.client.MLLPClient("127.0.0.1", port) as client:
        assert acked(client.send_message(siu("S12", longest, "LONG-1")))[:2] == ("AA", longest)
        got, control, error = acked(client.send_message(siu("S12", over, "LONG-2")))
        assert got == "AR" and "MSH-10" in error, (got, control, error)
    assert appointment(feed_clinic, "LONG-1") is not None and appointment(feed_clinic, "LONG-2") is None


def test_a_time_of_digits_other_than_ascii_is_not_a_dtm(runtime, feed_clinic, listen):
    """An HL7 DTM is ASCII digits: SCH-11.4 in Arabic-Indic digits, an MSH-7 in full-width ones, or a
    PID-7 in Devanagari ones is AE naming the field, nothing stored (before, Python's `\\d` and `int`
    took them: the message was applied AA)."""
    _, port = listen()
    arabic = "".join(chr(0x0660 + int(c)) for c in "20300305093000")
    wide = "".join(chr(0xFF10 + int(c)) for c in "20300301090000")
    devanagari = "".join(chr(0x0966 + int(c)) for c in "19800101")
    cases = [(siu("S12", "AD1", "AD-1", start=arabic), "SCH-11.4"), (siu("S12", "AD2", "AD-2", sent=wide), "MSH-7"),
             (siu("S12", "AD3", "AD-3").replace("19800101", devanagari), "PID-7")]
    with hl7.client.MLLPClient("127.0.0.1", port) as client:
        for message, where in cases:
            got, _, error = acked(client.send_message(message))
            assert (got, where in error) == ("AE", True), (where, got, error)
    assert FeedAppointment.select().count() == 0


def test_a_whole_message_before_bytes_outside_the_framing_is_answered(runtime, feed_clinic, listen):
    """A sender that writes a line feed after each frame's end (`0x0B` message `0x1C 0x0D 0x0A`, in
    one write): the message is whole, so it is applied and acknowledged; the byte after it is
    outside the framing, so the connection is then closed and nothing after it is read (before,
    whether the message was applied depended on how TCP cut the bytes: read together with the
    0x0A, as one write is, it got no ACK and was dropped, and so was every resend)."""
    _, port = listen()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(15)
        sock.sendall(SB + siu("S12", "LFE1", "LFE-1").encode() + EB + b"\n"
                     + SB + siu("S12", "LFE2", "LFE-2").encode() + EB)
        assert acked(_read_ack(sock))[:2] == ("AA", "LFE1")
        assert _closed(sock)
    assert appointment(feed_clinic, "LFE-1") is not None and appointment(feed_clinic, "LFE-2") is None
    assert not FeedMessage.select().where(FeedMessage.control_id == "LFE2").exists()


def test_a_hex_escape_is_read_in_the_messages_character_set(runtime, feed_clinic, listen):
    """`\\Xhh..\\` is bytes of the message's character set: in a UTF-8 message `M\\XC39C\\LLER` is
    MÜLLER (before, every escape was read as ISO 8859-1: MÃ\\x9cLLER, the name the snapshot listed);
    in an ISO 8859-1 message (a raw 0xE9 in it) `\\XDC\\` is Ü, as before."""
    _, port = listen()
    utf8 = siu("S12", "HX1", "HX-1").replace("DOE^JANE", "M\\XC39C\\LLER^J\\XC3A9\\R\\XC3B4\\ME").encode()
    latin = siu("S12", "HX2", "HX-2").replace("DOE^JANE", "M\\XDC\\LLER^RENEE").encode().replace(b"RENEE", b"REN\xe9E")
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(15)
        for data, control in ((utf8, "HX1"), (latin, "HX2")):
            sock.sendall(SB + data + EB)
            assert acked(_read_ack(sock))[:2] == ("AA", control)
    first, second = appointment(feed_clinic, "HX-1"), appointment(feed_clinic, "HX-2")
    assert (first.patient_last_name, first.patient_first_name) == ("MÜLLER", "JéRôME")
    assert (second.patient_last_name, second.patient_first_name) == ("MÜLLER", "RENéE")


def test_two_messages_in_one_frame_are_ae(runtime, feed_clinic, listen, settings):
    """One MLLP frame holding two messages (an engine batching without FHS/BHS): M1, whose physician
    is not named by NPI, then M2 of another appointment and physician. They are not read as one
    message: AE for M1's control id, nothing stored, the connection stays open (before, M1 was
    applied AA with M2's segments appended: its appointment took M2's physician, from the only AIP
    naming one by NPI, and another physician's snapshot listed M1's patient)."""
    _, port = listen()
    first = siu("S12", "TW1", "TW-1", mrn="E1", xcn="ROOM4^EXAM ROOM")
    second = siu("S12", "TW2", "TW-2", npi="1245319599", mrn="E2")
    with hl7.client.MLLPClient("127.0.0.1", port) as client:
        got, control, error = acked(client.send_message(first + "\r" + second))
        assert (got, control) == ("AE", "TW1"), error
        assert acked(client.send_message(second))[:2] == ("AA", "TW2")
    assert appointment(feed_clinic, "TW-1") is None
    assert appointment(feed_clinic, "TW-2").patient_identifier == "E2"
    assert {m["control_id"]: m["ack"] for m in hl7_messages(settings, feed_clinic)}["TW1"] == "AE"


def test_the_documented_try_it_sends_one_message_as_written(runtime, world, listen, settings, tmp_path):
    """docs/hl7-feed.md, "4. Try it before the clinic does", as written: its `orgs update` (the demo
    clinic's id swapped for this test's clinic), a listener on the real clock, its `send_siu.py`, and
    `hl7 messages` showing the message acknowledged AA."""
    import textwrap
    section = (ROOT / "docs" / "hl7-feed.md").read_text().split("4. Try it before the clinic does", 1)[1]
    commands = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    update = re.search(r"^\s*(svc-auth orgs update .*?--json)", commands, re.M).group(1)
    argv = update.replace("org_demo_clinic", world.org.id).split()[1:]
    done = subprocess.run([sys.executable, "-m", "cli.__main__", *argv], env=settings_env(settings), cwd=str(ROOT),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["hl7_facility"] == "DEMO_CLINIC"

    _, port = listen(SVC_CLOCK_OFFSET="0")
    script = tmp_path / "send_siu.py"
    script.write_text(textwrap.dedent(re.search(r"```python\n(.*?)```", section, re.S).group(1)))
    sent = subprocess.run([sys.executable, str(script)], env={"HL7_PORT": str(port), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)
    assert sent.returncode == 0, sent.stderr
    assert "MSA|AA|TRY0001" in sent.stdout, sent.stdout
    [message] = hl7_messages(settings, world.org)
    assert (message["control_id"], message["type"], message["ack"], message["note"]) == ("TRY0001", "SIU^S12", "AA", None)
    stored = appointment(world.org, "APT-TRY-1")
    tomorrow = dt.datetime.now(dt.timezone.utc).date() + dt.timedelta(days=1)
    assert (stored.status, stored.physician_npi, stored.start, stored.end) == (
        "booked", "1234567893", dt.datetime.combine(tomorrow, dt.time(15)), dt.datetime.combine(tomorrow, dt.time(15, 30)))


def test_an_appointment_without_a_physicians_npi_is_taken_with_a_note(runtime, feed_clinic, listen, settings):
    """AA (the appointment is stored), but an AIP-3 whose NPI is not typed as one (XCN.9 "NPI" is no
    OID) puts it in no physician's snapshot: `hl7 messages` says so, so the analyst's go-live check
    catches the mapping."""
    _, port = listen()
    with hl7.client.MLLPClient("127.0.0.1", port) as client:
        assert acked(client.send_message(siu("S12", "NONPI1", "APT-NONPI", xcn="1234567893^TOR^DOC^^^^^^NPI")))[0] == "AA"
        assert acked(client.send_message(siu("S12", "NPI1", "APT-NPI")))[0] == "AA"
    assert appointment(feed_clinic, "APT-NONPI").physician_npi == ""
    notes = {m["control_id"]: m["note"] for m in hl7_messages(settings, feed_clinic)}
    assert notes == {"NONPI1": "no physician NPI in AIP-3 or PV1-7: in no snapshot", "NPI1": None}
