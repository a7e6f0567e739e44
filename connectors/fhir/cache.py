"""Caches the FHIR connector keeps per process (owned by the runtime's connector state):
EHR access tokens and what each EHR's CapabilityStatement offers."""
from __future__ import annotations

import threading
import time

import urllib3

from connectors.fhir.transport import Watchdog

POOL_CONNECTIONS_PER_HOST = 8   # kept-alive connections per EHR host and process (SVC_DB_THREADS' default)
TOKEN_MARGIN_SECONDS = 30        # a cached token is renewed this long before it expires
PRACTITIONER_SECONDS = 3600      # how long the Practitioner id of an NPI is kept ...
NO_PRACTITIONER_SECONDS = 300    # ... and that the EHR has none (a physician the EHR adds is seen soon)
UNAVAILABLE_SECONDS = 60         # the EHR did not answer: sign-ins meanwhile do not wait on it again


class ExpiringCache:
    """Values of one runtime by key, each until `margin` seconds before it expires: the access
    tokens per (token endpoint, client id), and what each EHR's CapabilityStatement offers."""

    def __init__(self, margin: float = 0.0):
        self._lock = threading.Lock()
        self._values: dict = {}
        self.margin = margin

    def get(self, key):
        """The value, or None when there is none or it expired."""
        with self._lock:
            value, expires = self._values.get(key, (None, 0.0))
        return value if time.time() < expires - self.margin else None

    def put(self, key, value, expires_in: float) -> None:
        with self._lock:
            self._values[key] = (value, time.time() + expires_in)

    def drop(self, key) -> None:
        with self._lock:
            self._values.pop(key, None)


def bearer_tokens() -> ExpiringCache:
    """A runtime's EHR access tokens: renewed `TOKEN_MARGIN_SECONDS` before they expire."""
    return ExpiringCache(margin=TOKEN_MARGIN_SECONDS)


class FhirState:
    """What the FHIR connector keeps for one process: tokens, CapabilityStatement verdicts, and
    the Practitioner id of each NPI per EHR (`fhirUser`; "" = none), keyed by (base, NPI) so a
    user whose NPI changes is looked up anew."""

    def __init__(self):
        self.tokens = bearer_tokens()
        self.capabilities = ExpiringCache()
        self.practitioners = ExpiringCache()
        # Each EHR's SMART configuration (its token endpoint, its scope syntax), by base, for an hour:
        # not fetched again on every request (`ehr check` always fetches it anew).
        self.configurations = ExpiringCache()
        # Kept-alive connections to the EHRs (thread-safe; up to a pool thread's worth per EHR host), and
        # the one thread that holds every body read to its deadline.
        self.http = urllib3.PoolManager(retries=False, maxsize=POOL_CONNECTIONS_PER_HOST)
        self.watchdog = Watchdog()
