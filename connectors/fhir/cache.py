"""Caches the FHIR connector keeps per process (owned by the runtime's connector state):
EHR access tokens and what each EHR's CapabilityStatement offers."""
from __future__ import annotations

import itertools
import threading

from connectors.fhir.aio import AsyncConnections
from connectors.fhir.connections import Connections
from connectors.fhir.transport import Watchdog

POOL_CONNECTIONS_PER_HOST = 8   # kept-alive connections per EHR host and process (SVC_DB_THREADS' default)
TOKEN_MARGIN_SECONDS = 30        # a cached token is renewed this long before it expires
PRACTITIONER_SECONDS = 3600      # how long the Practitioner id of an NPI is kept ...
NO_PRACTITIONER_SECONDS = 300    # ... and that the EHR has none (a physician the EHR adds is seen soon)
UNAVAILABLE_SECONDS = 60         # the EHR did not answer: sign-ins meanwhile do not wait on it again
MAX_ENTRIES = 10_000             # per cache and process (EHR hosts x client ids, or NPIs per EHR)


class ExpiringCache:
    """Values of one runtime by key, each until `margin` seconds before it expires: the access
    tokens per (token endpoint, client id), and what each EHR's CapabilityStatement offers.

    Times are the runtime's clock (`clock`, e.g. `runtime.clock.time`), so a test that moves it
    expires them. At most `max_entries` are kept: an expired value is dropped when read, and a
    `put` that finds the cache full first drops every expired value, then the oldest put (one
    sweep per `max_entries` / 2 puts at worst, amortised)."""

    def __init__(self, clock, margin: float = 0.0, max_entries: int = MAX_ENTRIES):
        self._lock = threading.Lock()
        self._values: dict = {}  # key -> (value, expires); in order of the last put
        self.clock, self.margin, self.max_entries = clock, margin, max_entries

    def get(self, key):
        """The value, or None when there is none or it expired."""
        now = self.clock()
        with self._lock:
            value, expires = self._values.get(key, (None, 0.0))
            if now < expires - self.margin:
                return value
            if value is not None and now >= expires:
                del self._values[key]
        return None

    def put(self, key, value, expires_in: float) -> None:
        now = self.clock()
        with self._lock:
            self._values.pop(key, None)
            if len(self._values) >= self.max_entries:
                self._evict(now)
            self._values[key] = (value, now + expires_in)

    def drop(self, key) -> None:
        with self._lock:
            self._values.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._values)

    def _evict(self, now: float) -> None:
        """Under the lock: drop what expired; if that freed less than half, the oldest puts too."""
        self._values = {k: v for k, v in self._values.items() if v[1] > now}
        excess = len(self._values) - self.max_entries // 2
        for key in list(itertools.islice(self._values, max(0, excess))):
            del self._values[key]


def bearer_tokens(clock) -> ExpiringCache:
    """A runtime's EHR access tokens: renewed `TOKEN_MARGIN_SECONDS` before they expire."""
    return ExpiringCache(clock, margin=TOKEN_MARGIN_SECONDS)


class FhirState:
    """What the FHIR connector keeps for one process: tokens, CapabilityStatement verdicts, and
    the Practitioner id of each NPI per EHR (`fhirUser`; "" = none), keyed by (base, NPI) so a
    user whose NPI changes is looked up anew. `clock` is the runtime's (`runtime.clock.time`): every
    expiry, and the HTTP-date `Retry-After` of an EHR, is read against it."""

    def __init__(self, clock):
        self.clock = clock
        self.tokens = bearer_tokens(clock)
        self.capabilities = ExpiringCache(clock)
        self.practitioners = ExpiringCache(clock)
        # Each EHR's SMART configuration (its token endpoint, its scope syntax), by base, for an hour:
        # not fetched again on every request (`ehr check` always fetches it anew).
        self.configurations = ExpiringCache(clock)
        # Clinics whose EHR could not say what it offers (`fhir_api.clinic_capability`): not asked again
        # for a few seconds, so anonymous `metadata` requests cannot make svc-auth hammer a failing EHR.
        self.capability_failures = ExpiringCache(clock)
        # Kept-alive connections to the EHRs (thread-safe; up to a pool thread's worth per EHR host), and
        # the one thread that holds every exchange with an EHR to its deadline.
        self.http = Connections(POOL_CONNECTIONS_PER_HOST)
        self.watchdog = Watchdog()
        # The same for the IOLoop's reads (`connectors.fhir.aio`: used from the loop only).
        self.aio = AsyncConnections(POOL_CONNECTIONS_PER_HOST, self.http.context)
