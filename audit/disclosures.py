"""Recording disclosures: what handlers and workers call, the one place a record is written.

A handler describes its request once (`Disclosure`: who asked, from where, for what), then runs
its domain call through `disclosed`: the call runs on the runtime's pool, and in the same pool
job the record of its outcome (success with the patients the answer carries, or failure with the
patients asked for) joins the process's group commit (`audit.writer`); it is committed before the
handler writes a byte of the response. Workers and connectors append with `record`, blocking.
A record that cannot be written fails the request with 503 + Retry-After: there is no silent gap.
Log levels play no part.
SVC_DISCLOSURE_AUDIT=off turns recording off (audited at start, `audit.startup`).
"""
from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass

import peewee

from audit.chain import KEY_LABEL
from audit.writer import audit_unavailable
from errors import ApiError
from models.db import DATABASE_ERRORS


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
    """The key new links are made with (under SVC_HMAC_KEY)."""
    return runtime.hasher.derive(KEY_LABEL)


def chain_keys(runtime) -> list[bytes]:
    """The keys a link may have been made with: SVC_HMAC_KEY's, then SVC_HMAC_KEY_PREVIOUS's in order."""
    return runtime.hasher.derive_all(KEY_LABEL)


def _fields(disclosure: Disclosure, outcome: str, status: int | None, patients=None, resource_ids=None) -> dict:
    """The record of `disclosure` with its outcome (the patients and ids asked for, unless given)."""
    fields = {name: getattr(disclosure, name) for name in (
        "action", "organization_id", "application_id", "client_id", "user_id", "jti", "scope", "source_address",
        "request_id", "query", "resource_type")}
    fields.update(outcome=outcome, status=status,
                  patients=unique(disclosure.patients if patients is None else patients),
                  resource_ids=unique(disclosure.resource_ids if resource_ids is None else resource_ids))
    return fields


def record(runtime, disclosure: Disclosure, outcome: str, status: int | None,
           patients=None, resource_ids=None) -> None:
    """Append the record of `disclosure` now (blocking: a worker thread, or the runtime's pool)."""
    if not runtime.settings.disclosure_audit:
        return
    try:
        runtime.disclosure_writer.write(_fields(disclosure, outcome, status, patients, resource_ids))
    except DATABASE_ERRORS:
        raise  # Runtime.unit_of_work: the connection is discarded, the request answers 503 + Retry-After
    except peewee.PeeweeException as exc:
        raise audit_unavailable() from exc


async def disclosed(runtime, disclosure: Disclosure, describe, status: int, fn, /, *args):
    """`fn(*args)` on the runtime's pool, recorded before it returns (a handler's domain call):
    `describe(result)` -> (patients, resource ids) of a success, or None when the answer is no
    disclosure (a pending chart). An `ApiError` is recorded as a failure with its status and
    re-raised. The record joins the process's group commit in the same pool job
    (`ChainWriter.enqueue`); this returns once it is committed."""
    if not runtime.settings.disclosure_audit:
        return await runtime.run(fn, *args)
    committed = asyncio.get_running_loop().create_future()
    runtime.disclosure_writer.expect(committed)
    try:
        error, result, recorded = await runtime.run(_disclose, runtime, disclosure, describe, status, committed,
                                                    fn, *args)
    except BaseException:
        runtime.disclosure_writer.unexpect(committed)
        committed.add_done_callback(_consume)  # this job's own error answers the request
        raise
    if recorded:
        await committed
    if error is not None:
        raise error
    return result


def _disclose(runtime, disclosure: Disclosure, describe, status: int, committed, fn, /, *args):
    """On the pool: the domain call, then its record handed to the group commit -> (error, result,
    whether a record was handed over)."""
    writer = runtime.disclosure_writer
    try:
        result = fn(*args)
        described = describe(result)
    except ApiError as exc:
        writer.enqueue(_fields(disclosure, "failure", exc.status), committed)
        return exc, None, True
    except BaseException:
        writer.unexpect(committed)
        raise
    if described is None:
        writer.unexpect(committed)
        return None, result, False
    patients, resource_ids = described
    writer.enqueue(_fields(disclosure, "success", status, patients, resource_ids), committed)
    return None, result, True


def _consume(future) -> None:
    if not future.cancelled():
        future.exception()


def ehr_recorder(runtime, organization_id: str, application_id: str | None = None, client_id: str | None = None):
    """The callback a connector calls once per request to its EHR (per call on the sandbox):
    `recorder(outcome, resource_type, resource_ids, patients, query)` appends an `ehr.fetch` record."""
    base = Disclosure(action="ehr.fetch", organization_id=organization_id, application_id=application_id,
                      client_id=client_id)

    def recorder(outcome: str, resource_type: str, resource_ids=(), patients=(), query: str = "") -> None:
        record(runtime, dataclasses.replace(base, resource_type=resource_type, query=query), outcome, None,
               patients, resource_ids)
    return recorder
