"""Log lines written once per IOLoop turn in a `serve` process, not once per line (issue 37).

Every request ends with an access-log line. Written as it comes, each line is its own `write`
syscall (stderr is line-buffered) and its own `flush`. In `serve`, the JSON log handler's stream
is wrapped (`StreamHandler.setStream`) so that lines logged on the IOLoop's thread are kept until
the end of the current loop turn (`call_soon`), then written together: one `write` per turn for
every request that finished in it. Lines from any other thread (the pool, the in-process worker)
are written at once, after whatever is pending, so the order within the process is kept. A line
waits at most one loop turn; `close()` writes what is pending before the loop ends.
"""
from __future__ import annotations

import logging
import threading


class LoopBatchedStream:
    """A stream for `logging.StreamHandler`: `write` collects, `flush` (which the handler calls
    after every record) schedules one write of everything collected at the end of the loop turn."""

    def __init__(self, stream, loop):
        self.stream, self.loop = stream, loop
        self.loop_thread = threading.get_ident()
        self.pending: list[str] = []
        self.scheduled = False
        self.lock = threading.Lock()

    def write(self, text: str) -> None:
        with self.lock:
            self.pending.append(text)

    def flush(self) -> None:
        if threading.get_ident() != self.loop_thread:
            self.write_out()
        elif not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self.write_out)

    def write_out(self) -> None:
        """Write every pending line with one write, and flush the underlying stream."""
        with self.lock:
            if threading.get_ident() == self.loop_thread:
                self.scheduled = False
            if not self.pending:
                return
            text = "".join(self.pending)
            self.pending.clear()
            self.stream.write(text)
            self.stream.flush()


def batch_log_writes(loop):
    """Wrap the JSON log handler's stream (`conf.logging.configure_logging`) for this process's
    IOLoop; returns a function that writes what is pending and restores the stream (call it
    before the loop ends), or None when no JSON handler is configured."""
    handler = next((h for h in logging.getLogger().handlers if getattr(h, "_svc_json", False)), None)
    if handler is None or isinstance(handler.stream, LoopBatchedStream):
        return None
    batched = LoopBatchedStream(handler.stream, loop)
    handler.setStream(batched)

    def restore() -> None:
        batched.write_out()
        handler.setStream(batched.stream)
        batched.write_out()  # a line logged by another thread in between
    return restore
