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


class Later:
    """A domain call's result that is finished on the IOLoop (a FHIR read's exchange with the EHR:
    no pool thread waits on it): `exchange(offload)`, a coroutine function prepared by the pool
    job, then `then(fetched)` on the loop, where `fetched()` gives the exchange's result or raises
    its error; `offload(fn)` awaits blocking `fn()` on the pool. `release()` when it is over
    (the EHR slot the job held)."""

    def __init__(self, exchange, then):
        self.exchange, self.then = exchange, then
        self.release = lambda: None

    async def result(self, offload):
        try:
            try:
                value = await self.exchange(offload)
            except Exception as exc:  # noqa: BLE001 - `then` decides what the exchange's error answers
                error = exc

                def fetched():
                    raise error
            else:
                def fetched():
                    return value
            return self.then(fetched)
        finally:
            self.release()


class Recording:
    """One request's pool job and its disclosure record: opened on the IOLoop before the job (the
    writer then waits a moment for the record), run with `run(fn, ...)`, whose future gives
    `(error, result)`. The job `call`s the domain call; with the audit on, its record goes to the
    group commit, which settles the future once the record is committed (the pool does not: the
    job returns `runtime.pool.DEFERRED`, reached as `runtime.executor.DEFERRED`). Audit off
    (SVC_DISCLOSURE_AUDIT=off): `call` just calls."""

    def __init__(self, runtime):
        self.runtime = runtime
        self.future = asyncio.get_running_loop().create_future()
        self.audited = runtime.settings.disclosure_audit
        self.recorded = False
        if self.audited:
            runtime.disclosure_writer.expect(self.future)

    def run(self, fn, /, *args) -> asyncio.Future:
        """On the IOLoop: `fn(*args)` on the runtime's pool -> the future of `(error, result)`;
        `fn` calls `call` (or `skip`) and returns what `call` returned, or raises."""
        return self.runtime.run_into(self.future, fn, *args)

    def call(self, disclosure: Disclosure, describe, status: int, fn, /, *args):
        """On the pool: `fn(*args)`, then its record handed to the group commit with its outcome
        `(error, result)` (DEFERRED returned: the commit settles the future), or, when nothing is
        recorded, that outcome. `describe(result)` -> (patients, resource ids) of a success, or
        None when the answer is no disclosure (a pending chart); an `ApiError` is recorded as a
        failure with its status and is the outcome's error, not raised."""
        if not self.audited:
            try:
                return None, fn(*args)
            except ApiError as exc:
                return exc, None
        try:
            result = fn(*args)
        except ApiError as exc:
            return self._record(disclosure, describe, status, exc, None, self.runtime.disclosure_writer.enqueue)
        except BaseException:
            self.runtime.disclosure_writer.unexpect(self.future)
            raise
        if isinstance(result, Later):  # finished on the IOLoop (`finish`): its record comes from there
            self._later = disclosure, describe, status
            return None, result
        return self._record(disclosure, describe, status, None, result, self.runtime.disclosure_writer.enqueue)

    async def finish(self, later: Later):
        """On the IOLoop: the outcome `(error, result)` of a `call` whose result was `later`, once
        its record (with the audit on) is committed; its record joins the group commit from the
        loop (`ChainWriter.enqueue_soon`: no pool job of its own)."""
        try:
            result = await later.result(self.runtime.run)
        except ApiError as exc:
            error, result = exc, None
        except BaseException:
            self.skip()
            raise
        else:
            error = None
        if not self.audited:
            return error, result
        writer = self.runtime.disclosure_writer
        writer.unexpect(self.future)  # the pool job's, settled with `later`: this record comes with a future of its own
        self.future = asyncio.get_running_loop().create_future()
        outcome = self._record(*self._later, error, result, writer.enqueue_soon)
        return outcome if outcome is not self.runtime.executor.DEFERRED else await self.future

    def _record(self, disclosure: Disclosure, describe, status: int, error, result, enqueue):
        """`call`'s record of `fn`'s outcome: handed to the group commit by `enqueue` (DEFERRED
        returned: the commit settles the future), or, when the answer is no disclosure, the outcome."""
        writer = self.runtime.disclosure_writer
        if error is not None:
            self.recorded = True
            enqueue(_fields(disclosure, "failure", error.status), self.future, (error, None))
            return self.runtime.executor.DEFERRED
        try:
            described = describe(result)
        except ApiError as exc:
            return self._record(disclosure, describe, status, exc, None, enqueue)
        except BaseException:
            writer.unexpect(self.future)
            raise
        if described is None:
            writer.unexpect(self.future)
            return None, result
        patients, resource_ids = described
        self.recorded = True
        enqueue(_fields(disclosure, "success", status, patients, resource_ids), self.future, (None, result))
        return self.runtime.executor.DEFERRED

    def skip(self) -> None:
        """No record will follow (the request was refused before its domain call, or its job
        raised: its own error answers the request); idempotent."""
        if self.audited and not self.recorded:
            self.runtime.disclosure_writer.unexpect(self.future)


async def disclosed(runtime, disclosure: Disclosure, describe, status: int, fn, /, *args):
    """`fn(*args)` on the runtime's pool, recorded before it returns (a handler's domain call):
    `Recording.call`, whose error is raised here once its record is committed. The record joins
    the process's group commit in the same pool job (`ChainWriter.enqueue`)."""
    recording = Recording(runtime)
    try:
        error, result = await recording.run(recording.call, disclosure, describe, status, fn, *args)
    except BaseException:
        recording.skip()
        raise
    if error is not None:
        raise error
    return result


def ehr_recorder(runtime, organization_id: str, application_id: str | None = None, client_id: str | None = None,
                 user_id: str | None = None):
    """The callback a connector calls once per request to its EHR (per call on the sandbox):
    `recorder(outcome, resource_type, resource_ids, patients, query)` appends an `ehr.fetch` record
    (`user_id`: the person the fetched data is shown to, as the hub's appointments)."""
    base = Disclosure(action="ehr.fetch", organization_id=organization_id, application_id=application_id,
                      client_id=client_id, user_id=user_id)

    def recorder(outcome: str, resource_type: str, resource_ids=(), patients=(), query: str = "") -> None:
        record(runtime, dataclasses.replace(base, resource_type=resource_type, query=query), outcome, None,
               patients, resource_ids)
    return recorder
