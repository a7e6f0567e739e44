"""How far one caller lets a connector go with the clinic's EHR: `Bounds`, chosen by the caller.

The FHIR API and the hub page answer a person now (`interactive`), `ehr check` an operator
(`check`), the night and chart builds run in the background (`batch`; `snapshot` and `chart` add a
deadline for the whole build). Each bound, when hit, raises `BoundExceeded` naming it
(`DeadlineExceeded` for time): the FHIR API answers 502 (504 for a deadline), the night fails for
that clinic, the hub renders without appointments. The operator tunes them with the `SVC_EHR_*`
and `SVC_*_BUILD_DEADLINE` settings (docs/security.md lists each with its default)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Bounds:
    """Limits on the requests of one connector (one FHIR API call, one hub page, one night).

    - `connect`: seconds to open a connection;
    - `request_deadline`: wall-clock seconds per request, every retry, wait and byte included (a
      body dripping a byte a second ends at the deadline);
    - `operation_deadline`: wall-clock seconds for every request of the connector together, from
      its creation (None: only the per-request deadline);
    - `max_bytes`: the largest response body read (streamed; the connection is dropped past it);
    - `max_pages`: the pages of one search followed (a repeated `next` URL ends it at once);
    - `max_retry_after`: the longest `Retry-After` waited; a longer one ends the attempts;
    - `attempts`: tries per request (429, 5xx, timeouts, refused connections)."""

    name: str
    connect: float
    request_deadline: float
    max_bytes: int
    max_pages: int
    max_retry_after: float
    attempts: int = 4
    operation_deadline: float | None = None

    @classmethod
    def interactive(cls, settings) -> Bounds:
        """A person waits (the FHIR API's proxied reads and searches, the hub page): the whole call,
        every page of a search included, ends within `SVC_EHR_INTERACTIVE_DEADLINE`."""
        deadline = float(settings.ehr_interactive_deadline)
        return cls("interactive", connect=min(3.0, deadline), request_deadline=deadline,
                   operation_deadline=deadline, max_bytes=settings.ehr_interactive_max_bytes,
                   max_pages=settings.ehr_interactive_max_pages, max_retry_after=min(2.0, deadline), attempts=3)

    @classmethod
    def check(cls, settings) -> Bounds:
        """`svc-auth ehr check`: each step within the interactive deadline, one page per search."""
        deadline = float(settings.ehr_interactive_deadline)
        return cls("check", connect=min(3.0, deadline), request_deadline=deadline, max_bytes=settings.ehr_interactive_max_bytes,
                   max_pages=1, max_retry_after=min(2.0, deadline), attempts=3)

    @classmethod
    def chart(cls, settings) -> Bounds:
        """A chart build: the batch bounds, and all its requests within `SVC_CHART_BUILD_DEADLINE`
        (an EHR paging slowly but within each request's deadline cannot keep a request pending for days)."""
        return dataclasses.replace(cls.batch(settings), name="chart",
                                   operation_deadline=float(settings.chart_build_deadline))

    @classmethod
    def snapshot(cls, settings) -> Bounds:
        """One clinic's night: the batch bounds, and all its requests within `SVC_SNAPSHOT_BUILD_DEADLINE`
        (an EHR answering each page just inside its deadline cannot hold a worker and the night's lease
        for hours; `workers.snapshot` also stops the build at its next batch of rows past it)."""
        return dataclasses.replace(cls.batch(settings), name="snapshot",
                                   operation_deadline=float(settings.snapshot_build_deadline))

    @classmethod
    def batch(cls, settings) -> Bounds:
        """The nightly snapshot and chart builds: each request within `SVC_EHR_BATCH_DEADLINE`, each
        search within `SVC_EHR_BATCH_MAX_PAGES` pages."""
        deadline = float(settings.ehr_batch_deadline)
        return cls("batch", connect=min(10.0, deadline), request_deadline=deadline,
                   max_bytes=settings.ehr_batch_max_bytes, max_pages=settings.ehr_batch_max_pages,
                   max_retry_after=min(30.0, deadline), attempts=4)
