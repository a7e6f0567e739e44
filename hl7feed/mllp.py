"""MLLP framing (HL7 v2 Minimal Lower Layer Protocol): each message is `0x0B` content `0x1C 0x0D`.

`Deframer` takes a connection's bytes as they come and hands back whole messages. It keeps at
most one message (`MAX_MESSAGE` bytes) in memory: a longer one, a byte outside a frame (before
`0x0B`, or after `0x1C` anything but `0x0D`), or a `0x0B` inside one (MLLP content never holds it:
a second start block means the message before it was cut off, and reading on would splice the
next one onto it), is a `FramingError`, and the connection is closed whatever follows on it. The
whole messages before the error are handed back first (`feed`, then `check` raises it).
"""
from __future__ import annotations

START = b"\x0b"
END = b"\x1c\x0d"
MAX_MESSAGE = 1024 * 1024  # 1 MiB of content


class FramingError(Exception):
    """The peer broke the framing or the size bound: close the connection, store nothing."""


class Deframer:
    def __init__(self, max_message: int = MAX_MESSAGE):
        self.max_message = max_message
        self._buffer = bytearray()
        self._in_frame = False
        self._ending = False  # 0x1C seen: the next byte must be 0x0D
        self.broken: FramingError | None = None  # the framing broke after whole messages `feed` returned

    @property
    def idle(self) -> bool:
        """No part of a message is waiting for its end."""
        return not self._in_frame

    def feed(self, data: bytes) -> list[bytes]:
        """The messages `data` completes (their content, without framing), in order. A framing error
        after some of them is kept (`check` raises it) so that those whole messages are answered
        first, however TCP cut the bytes; one before any is raised at once."""
        self.check()
        messages: list[bytes] = []
        try:
            self._split(data, messages)
        except FramingError as exc:
            if not messages:
                raise
            self.broken = exc
        return messages

    def check(self) -> None:
        """Raise the framing error that followed the messages `feed` last returned, if any."""
        if self.broken is not None:
            raise self.broken

    def _split(self, data: bytes, messages: list[bytes]) -> None:
        i, n = 0, len(data)
        while i < n:
            if not self._in_frame:
                if data[i] != 0x0B:
                    raise FramingError("bytes outside MLLP framing (a message starts with 0x0B)")
                self._in_frame = True
                i += 1
            elif self._ending:
                if data[i] != 0x0D:
                    raise FramingError("0x1C not followed by 0x0D")
                messages.append(bytes(self._buffer))
                self._buffer.clear()
                self._in_frame = self._ending = False
                i += 1
            else:
                end = data.find(b"\x1c", i)
                self._take(data, i, n if end < 0 else end)
                if end < 0:
                    break
                self._ending = True
                i = end + 1

    def _take(self, data: bytes, i: int, j: int) -> None:
        if len(self._buffer) + (j - i) > self.max_message:
            raise FramingError(f"message over {self.max_message} bytes")
        if data.find(START, i, j) >= 0:
            raise FramingError("0x0B inside a message (a start block before the previous message's end)")
        self._buffer += data[i:j]


def frame(message: bytes) -> bytes:
    return START + message + END
