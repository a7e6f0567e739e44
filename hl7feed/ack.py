"""The original-mode acknowledgment of a message: MSH, MSA, and for `AE`/`AR` an ERR saying why."""
from __future__ import annotations

from types import MappingProxyType

import datetime as dt
import re
import uuid

from hl7feed.siu import MAX_CONTROL_ID, Header

APPLICATION = "SVC-AUTH"
ERROR_NAMES = MappingProxyType({"100": "Segment sequence error", "101": "Required field missing", "102": "Data type error",
               "103": "Table value not found", "200": "Unsupported message type", "201": "Unsupported event code",
               "203": "Unsupported version id", "204": "Unknown key identifier", "207": "Application internal error"})
"""HL7 table 0357 (message error condition codes)."""
HD_LENGTH = 227
"""What an ACK echoes of MSH-3 to MSH-6 (HD fields: HL7 v2.5's maximum length), before escaping."""
CONTROL_ID_LENGTH = MAX_CONTROL_ID
"""What an ACK echoes of MSH-10: all of one taken (`siu.check_type` refuses a longer one, whose
`AR` echoes this much)."""
TRIGGER_LENGTH = 3
"""What an ACK echoes of MSH-9.2 (an event type code: ID, 3 characters)."""
_WHERE = re.compile(r"^([A-Z][A-Z0-9]{2})(?:-(\d+)(?:\.(\d+))?)?$")


def location(where: str) -> str:
    """`SCH-11.4` as an ERR-2 error location (ERL): `SCH^1^11^1^4`."""
    m = _WHERE.match(where)
    if not m:
        return ""
    segment, field, component = m.groups()
    return "^".join([segment, "1"] + ([field] if field else []) + (["1", component] if component else []))


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def escape(text: str) -> str:
    """`text` safe inside a field with the default encoding characters; a control character (an
    echoed value may hold one, decoded from an escape) as a hex escape, so that no CR, 0x0B or 0x1C
    can end a segment or the ACK's MLLP frame."""
    text = (text.replace("\\", "\\E\\").replace("|", "\\F\\").replace("^", "\\S\\").replace("&", "\\T\\")
            .replace("~", "\\R\\"))
    return _CONTROL.sub(lambda m: f"\\X{ord(m.group()):02X}\\", text)


def echo(value: str, length: int) -> str:
    """A value of the message, cut to `length` characters then escaped: an ACK stays small whatever
    the message held (escaping makes a control character 5 bytes)."""
    return escape(value[:length])


def ack(code: str, h: Header | None, now: dt.datetime, text: str = "", where: str = "", error: str = "207") -> bytes:
    """The ACK of a message (`h` None: its MSH could not be read) with MSA-1 `code`."""
    h = h or Header("", "", "", "", "", "", "", "2.5.1")
    stamp = now.strftime("%Y%m%d%H%M%S") + "+0000"
    version = h.version if h.version in ("2.3", "2.3.1", "2.4", "2.5", "2.5.1") else "2.5.1"
    control = "ACK" + uuid.uuid4().hex[:17]  # unique without shared state (MSH-10: up to 20 characters)
    segments = [
        "|".join(["MSH", "^~\\&", echo(h.receiving_application, HD_LENGTH) or APPLICATION,
                  echo(h.receiving_facility, HD_LENGTH), echo(h.sending_application, HD_LENGTH),
                  echo(h.facility, HD_LENGTH), stamp, "", f"ACK^{echo(h.trigger, TRIGGER_LENGTH)}^ACK", control,
                  "P", version]),
        "|".join(["MSA", code, echo(h.control_id, CONTROL_ID_LENGTH)] + ([escape(text)] if text else [])),
    ]
    if code != "AA":
        error = error if error in ERROR_NAMES else "207"
        segments.append("|".join(["ERR", "", location(where), f"{error}^{ERROR_NAMES[error]}^HL70357", "E", "", "",
                                  "", escape(text)]))
    return ("\r".join(segments) + "\r").encode("utf-8")
