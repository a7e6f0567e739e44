"""HL7v2 ER7 ("pipe and hat") messages: segments, fields, repetitions, components, escapes; DTM times.

`parse(bytes)` reads the encoding characters from MSH-1/MSH-2 and splits the message once; values
are read with `Message.value(segment, field, component, subcomponent, repetition)`, escapes
decoded. Segments are separated by CR (LF and CRLF are accepted too: the end of MSH says which the
message uses, so an LF left inside a field of a CR message stays in its field). Every position
counts from 1 as HL7 does, MSH-1 being the field separator itself. Only an MSH that cannot be read
is a `ParseError`; a later segment whose name is not one is kept aside (`Message.malformed`), for
`siu.appointment` to refuse as content (`AE`).
"""
from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from zoneinfo import ZoneInfo


class ParseError(Exception):
    """Not an HL7v2 message whose MSH can be read."""


class BadTime(ValueError):
    """A value that is not an HL7 DTM (or DT)."""


@dataclass(frozen=True)
class Encoding:
    field: str = "|"
    component: str = "^"
    repetition: str = "~"
    escape: str = "\\"
    subcomponent: str = "&"


_CR_SEGMENTS = re.compile(r"\r\n|\r")
_LF_SEGMENTS = re.compile(r"\n")
_SEGMENT_ID = re.compile(r"^[A-Z][A-Z0-9]{2}$")


class Message:
    def __init__(self, segments: list[list[str]], encoding: Encoding, has_nul: bool, malformed: int = 0,
                 charset: str = "utf-8"):
        self.segments = segments
        self.charset = charset  # what the message was read as: `\X..\` escapes are bytes of it
        self.encoding = encoding
        self.has_nul = has_nul
        self.malformed = malformed  # segments after MSH whose name is not one (left out of `segments`)
        self._escape = re.compile(re.escape(encoding.escape) + r"([^" + re.escape(encoding.escape) + r"]*)"
                                  + re.escape(encoding.escape)) if encoding.escape else None

    def all(self, name: str) -> list[list[str]]:
        return [s for s in self.segments if s[0] == name]

    def first(self, name: str) -> list[str] | None:
        for s in self.segments:
            if s[0] == name:
                return s
        return None

    def repetitions(self, segment: list[str] | None, field: int) -> list[str]:
        if segment is None or field >= len(segment) or (segment[0] == "MSH" and field <= 2):
            return []
        return segment[field].split(self.encoding.repetition)

    def value(self, segment: list[str] | None, field: int, component: int = 1, subcomponent: int = 1,
              repetition: int = 1) -> str:
        """The decoded text at that position ('' when absent)."""
        reps = self.repetitions(segment, field)
        if len(reps) < repetition:
            return ""
        return self.part(reps[repetition - 1], component, subcomponent)

    def part(self, raw_field: str, component: int = 1, subcomponent: int = 1) -> str:
        """A component (and subcomponent) of one repetition of a field, decoded."""
        components = raw_field.split(self.encoding.component)
        if len(components) < component:
            return ""
        subs = components[component - 1].split(self.encoding.subcomponent)
        return self.decode(subs[subcomponent - 1]) if len(subs) >= subcomponent else ""

    def components(self, raw_field: str) -> list[str]:
        return raw_field.split(self.encoding.component)

    def decode(self, text: str) -> str:
        """HL7 escape sequences (\\F\\ \\S\\ \\T\\ \\R\\ \\E\\ \\Xhh..\\, its bytes in the message's
        character set; formatting ones dropped)."""
        if not self._escape or self.encoding.escape not in text:
            return text.strip()
        e = self.encoding
        table = {"F": e.field, "S": e.component, "T": e.subcomponent, "R": e.repetition, "E": e.escape}

        def one(match: re.Match) -> str:
            code = match.group(1)
            if code in table:
                return table[code]
            if code[:1] == "X" and re.fullmatch(r"(?:[0-9A-Fa-f]{2})+", code[1:] or "x"):
                return _text_of(bytes.fromhex(code[1:]), self.charset)
            return ""
        return self._escape.sub(one, text).strip()


def parse(data: bytes) -> Message:
    """The message in `data` (UTF-8, else ISO 8859-1 text); ParseError when its MSH cannot be read."""
    try:
        text, charset = data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, charset = data.decode("latin-1"), "latin-1"
    first_end = re.search(r"[\r\n]", text)   # what ends MSH ends every segment: CR (or CRLF), else LF
    separators = _CR_SEGMENTS if first_end is None or first_end.group() == "\r" else _LF_SEGMENTS
    lines = [line for line in separators.split(text) if line.strip()]
    if not lines or not lines[0].startswith("MSH") or len(lines[0]) < 8:
        raise ParseError("the message does not start with an MSH segment")
    head = lines[0]
    separator = head[3]
    if separator.isalnum() or separator in " \t":
        raise ParseError("MSH-1 is not a field separator")
    encoding_chars = head[4:].split(separator, 1)[0]
    if not 2 <= len(encoding_chars) <= 5 or separator in encoding_chars or len(set(encoding_chars)) != len(encoding_chars):
        raise ParseError("MSH-2 does not hold the encoding characters")
    chars = (encoding_chars + "\x00\x00\x00")[:4]
    encoding = Encoding(separator, chars[0], chars[1], chars[2] if chars[2] != "\x00" else "",
                        chars[3] if chars[3] != "\x00" else "\x01")
    segments, malformed = [], 0
    for line in lines:
        fields = line.split(separator)
        if not _SEGMENT_ID.match(fields[0]):
            malformed += 1   # never quoted: it may be a piece of patient text
            continue
        if fields[0] == "MSH":
            fields = ["MSH", separator, *fields[1:]]  # MSH-n is fields[n], like every other segment
        segments.append(fields)
    return Message(segments, encoding, "\x00" in text, malformed, charset)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _text_of(data: bytes, charset: str) -> str:
    """Bytes of a message read as `charset` (UTF-8, else ISO 8859-1: an escape whose bytes are not
    UTF-8 is read as 8859-1, as a message would be)."""
    return data.decode(charset if charset != "utf-8" or _is_utf8(data) else "latin-1")


CLOCK_SKEW = dt.timedelta(minutes=10)
"""How far ahead of ours a sender's clock may run (less than any zone's repeated hour: 30 min at least).
An MSH-7 further ahead orders its message as received (`siu.appointment`)."""
_DTM = re.compile(r"^([0-9]{4})(?:([0-9]{2})(?:([0-9]{2})(?:([0-9]{2})(?:([0-9]{2})(?:([0-9]{2})(?:\.([0-9]{1,4}))?)?)?)?)?)?"
                  r"([+-][0-9]{4})?$")
"""ASCII digits only (`\\d` takes Arabic-Indic, full-width and other digits, which `int` reads)."""


def parse_dtm(value: str, zone: str = "UTC", received: dt.datetime | None = None) -> dt.datetime:
    """An HL7 DTM (YYYY[MM[DD[HH[MM[SS[.S...]]]]]][+/-ZZZZ]) as a naive UTC datetime; a time
    without an offset is in `zone` (IANA). One in the hour repeated when clocks go back is its first
    occurrence, unless `received` (naive UTC: the time of a message received then) says the second
    one had already come (within `CLOCK_SKEW`): a message's own time is never in the future."""
    m = _DTM.match(value.strip())
    if not m:
        raise BadTime(f"{value[:40]!r} is not an HL7 DTM")
    year, month, day, hour, minute, second, fraction, offset = m.groups()
    try:
        local = dt.datetime(int(year), int(month or 1), int(day or 1), int(hour or 0), int(minute or 0),
                            int(second or 0), int((fraction or "0").ljust(6, "0")))
        if offset:
            sign = 1 if offset[0] == "+" else -1
            hours, minutes = int(offset[1:3]), int(offset[3:5])
            if hours > 23 or minutes > 59:
                raise ValueError("offset out of range")
            tz = dt.timezone(sign * dt.timedelta(hours=hours, minutes=minutes))
        else:
            tz = ZoneInfo(zone or "UTC")
        first = local.replace(tzinfo=tz).astimezone(dt.timezone.utc).replace(tzinfo=None)
        if not offset and received is not None:
            second = local.replace(tzinfo=tz, fold=1).astimezone(dt.timezone.utc).replace(tzinfo=None)
            if first < second <= received + CLOCK_SKEW:   # repeated (a skipped time reads the other way)
                return second
        return first
    except (ValueError, OverflowError) as exc:
        raise BadTime(f"{value[:40]!r} is not an HL7 DTM ({exc})") from None


def parse_date(value: str) -> dt.date:
    """The date of an HL7 DT/DTM (a birth date: YYYYMMDD, any time and offset ignored)."""
    m = _DTM.match(value.strip())
    if not m or not m.group(3):
        raise BadTime(f"{value[:40]!r} is not an HL7 date (YYYYMMDD)")
    try:
        return dt.date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
    except ValueError as exc:
        raise BadTime(f"{value[:40]!r} is not an HL7 date ({exc})") from None
