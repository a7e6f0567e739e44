"""Recording disclosures: what handlers and workers call, the one place a record is written.

A handler describes its request once (`Disclosure`: who asked, from where, for what), then runs
its domain call through `disclosed`, on the pool thread of the same unit of work: the record of
the outcome (success with the patients the answer carries, or failure with the patients asked
for) is committed before the handler writes a byte of the response. A record that cannot be
written fails the request with 503 + Retry-After: there is no silent gap. Log levels play no part.
SVC_DISCLOSURE_AUDIT=off turns recording off (audited at start, `audit.startup`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import peewee

from audit.chain import KEY_LABEL
from errors import ApiError
from models.db import DATABASE_ERRORS

RETRY_AFTER_SECONDS = 2


@dataclass(frozen=True)
class Disclosure:
    """One request that may disclose patient data, as its handler sees it before answering."""

    action: str
    organization_id: str | None = None
    application_id: str | None = None
    client_id: str | None = None
    user_id: str | None = None
    jti: str | None = None
    scope: str | None = None
    source_address: str | None = None
    request_id: str | None = None
    query: str = ""
    resource_type: str = ""
    resource_ids: tuple = ()
    patients: tuple = ()
    """What was asked for: the patients and ids a failure record names."""


def without_signature(query: str) -> str:
    """The raw query string minus any `signature` parameter (as sent, not re-encoded)."""
    return "&".join(part for part in (query or "").split("&") if part and part.split("=", 1)[0] != "signature")


def unique(values) -> list[str]:
    """Distinct non-empty strings, in first-seen order."""
    return list(dict.fromkeys(v for v in values if isinstance(v, str) and v))


def chain_key(runtime) -> bytes:
    return runtime.hasher.derive(KEY_LABEL)


def record(runtime, disclosure: Disclosure, outcome: str, status: int | None,
           patients=None, resource_ids=None) -> None:
    """Append the record of `disclosure` (blocking: the runtime pool, or a worker thread)."""
    if not runtime.settings.disclosure_audit:
        return
    fields = {name: getattr(disclosure, name) for name in (
        "action", "organization_id", "application_id", "client_id", "user_id", "jti", "scope", "source_address",
        "request_id", "query", "resource_type")}
    fields.update(outcome=outcome, status=status,
                  patients=unique(disclosure.patients if patients is None else patients),
                  resource_ids=unique(disclosure.resource_ids if resource_ids is None else resource_ids))
    try:
        runtime.disclosure_writer.write(fields)
    except DATABASE_ERRORS:
        raise  # Runtime.unit_of_work: the connection is discarded, the request answers 503 + Retry-After
    except peewee.PeeweeException as exc:
        raise ApiError(503, "audit_unavailable", "The disclosure audit cannot record this request; nothing was "
                                                 "disclosed. Retry shortly.",
                       {"Retry-After": str(RETRY_AFTER_SECONDS)}) from exc


def disclosed(runtime, disclosure: Disclosure, describe, status: int, fn, /, *args):
    """`fn(*args)`, recorded: `describe(result)` -> (patients, resource ids) of a success, or None
    when the answer is no disclosure (a pending chart). An `ApiError` is recorded as a failure with
    its status and re-raised."""
    try:
        result = fn(*args)
    except ApiError as exc:
        record(runtime, disclosure, "failure", exc.status)
        raise
    described = describe(result)
    if described is not None:
        patients, resource_ids = described
        record(runtime, disclosure, "success", status, patients, resource_ids)
    return result


def ehr_recorder(runtime, organization_id: str, application_id: str | None = None, client_id: str | None = None):
    """The callback a connector calls once per request to its EHR (per call on the sandbox):
    `recorder(outcome, resource_type, resource_ids, patients, query)` appends an `ehr.fetch` record."""
    base = Disclosure(action="ehr.fetch", organization_id=organization_id, application_id=application_id,
                      client_id=client_id)

    def recorder(outcome: str, resource_type: str, resource_ids=(), patients=(), query: str = "") -> None:
        record(runtime, dataclasses.replace(base, resource_type=resource_type, query=query), outcome, None,
               patients, resource_ids)
    return recorder
