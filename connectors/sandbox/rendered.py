"""A bounded per-process memory of a sandbox patient's rendered resources (the FHIR API's hot path).

The generator is deterministic: a patient's resources of one type follow from the clinic, the
patient and the type alone. They are rendered once and kept, keyed also on the date the
connector's clock says it is (`SandboxConnector.now`), so whatever is relative to "today" is
rendered anew on the next day. Held by the runtime (`Runtime.connector_state("sandbox", ...)`),
one per process; least recently used entries go first once more than `max_resources` resources
are held. The resources are shared between requests: callers must not change them (the FHIR API
wraps them in a Bundle and encodes them, never edits them).
"""
from __future__ import annotations

import collections
import threading

MAX_RESOURCES = 20_000
"""Resources kept per process at most (a rendered Observation is about 3 KB of Python objects)."""


class RenderedResources:
    """`get(key, render)`: the tuple `render()` returned for `key`, rendered at most once while kept."""

    def __init__(self, max_resources: int = MAX_RESOURCES):
        self.max_resources = max_resources
        self._entries: collections.OrderedDict[tuple, tuple] = collections.OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    def get(self, key: tuple, render) -> tuple:
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                return found
        found = tuple(render())  # outside the lock: two threads may render the same key once each
        with self._lock:
            if key not in self._entries and len(found) <= self.max_resources:
                self._entries[key] = found
                self._held += len(found)
                while self._held > self.max_resources:
                    _, dropped = self._entries.popitem(last=False)
                    self._held -= len(dropped)
        return found

    def __len__(self) -> int:
        return len(self._entries)
