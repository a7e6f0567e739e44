"""One FHIR read or search in one trip to the runtime's pool: admitted, answered and recorded.

In order, in the pool job `answer` (a second trip, and its thread hand-offs, cost a read about a
tenth of its CPU: issue 35 item 6):
1. the bearer token (`fhir_api.access.authenticate`): 401/403/404, nothing counted or recorded;
2. the calling app's registered origin (CORS: the answer, errors included, is readable there);
3. the limits: one `hit_all_now` of the limiter (`fhir_api.limits`): 429 `throttled`, or 503
   `transient` when its store (Redis) cannot be reached;
4. a slot of the clinic's EHR in this process (`runtime.ehr_concurrency`): none free, 503 (not
   for a request that does not call the EHR, `Ask.uses_ehr` False: Bulk Data's kick-off, status, files);
5. the request's own checks (its type and id: 404/400), then its domain call, recorded by the
   disclosure audit (`audit.disclosures.Recording`), success or failure. A call that finishes on
   the IOLoop (a FHIR clinic's read: `audit.disclosures.Later`, the EHR asked from the loop) keeps
   the EHR slot until the EHR has answered, and is recorded from there (`Recording.finish`).
Nothing is recorded before step 5. What steps 2 and 3 decided is kept on the `Admission` the
handler passed in, so every answer after the limiter carries its `RateLimit-*` headers, however
the job ended.
"""
from __future__ import annotations

import dataclasses

from audit.disclosures import Disclosure, Later, Recording
from errors import ApiError
from fhir_api.access import Caller, authenticate
from fhir_api.disclosure import fhir_disclosure
from fhir_api.limits import counters, refusal_message
from fhir_api.outcome import FhirError
from oauth.cors import origin_allowed_for_client
from ratelimit import RateLimiterUnavailable

LIMITER_RETRY_AFTER = 5   # seconds: the rate limiter's store (Redis) is unreachable
EHR_BUSY_RETRY_AFTER = 2  # seconds: every slot of the clinic's EHR is in use in this process


@dataclasses.dataclass(frozen=True)
class Ask:
    """The request as the IOLoop read it: its clinic, credentials and origin, and what it asks."""

    organization_id: str
    authorization: str | None
    origin: str | None
    action: str               # `read` or `search`
    resource_type: str
    path_id: str | None       # a read's id
    raw_args: dict            # the query's arguments, undecoded (the disclosure names the patients asked)
    request: Disclosure       # the handler's request-level disclosure fields
    uses_ehr: bool = True     # False: no call to the clinic's EHR (Bulk Data's status, files, Groups): no slot taken
    status: int = 200         # the HTTP status of a success, which its record holds (a Bulk kick-off's: 202)


@dataclasses.dataclass
class Admission:
    """What the job decided before the domain call (filled in as it goes)."""

    cors_origin: str | None = None
    limit_headers: dict = dataclasses.field(default_factory=dict)
    refused_by: str | None = None  # the counter that refused (429), for the metrics


def answer(runtime, ask: Ask, admission: Admission, recording: Recording, checks, describe, fn, *args):
    """On the pool: steps 1 to 5 -> (error, result) of `fn(runtime, caller, *args)`, or DEFERRED
    when `recording` took that outcome to the group commit (`Recording.call`); an error after
    authentication is returned, an authentication refusal raised."""
    try:
        caller = authenticate(runtime, ask.authorization, ask.organization_id)
    except BaseException:
        recording.skip()
        raise
    try:
        if ask.origin and origin_allowed_for_client(runtime.applications, caller.claims.get("client_id"), ask.origin):
            admission.cors_origin = ask.origin
        _count(runtime, caller, admission)
        cap, clinic = runtime.ehr_concurrency, caller.organization_id
        if ask.uses_ehr and not cap.try_acquire(clinic):
            raise FhirError(503, "transient", "Too many requests to this clinic's EHR are in progress; "
                                              f"retry after {EHR_BUSY_RETRY_AFTER} seconds.",
                            {"Retry-After": str(EHR_BUSY_RETRY_AFTER)})
        held = ask.uses_ehr
        try:
            checks()  # 404 / 400 before the disclosure record holds them
            disclosure = fhir_disclosure(caller, ask.action, ask.resource_type, ask.path_id, ask.raw_args, ask.request)
            outcome = recording.call(disclosure, describe, ask.status, fn, runtime, caller, *args)
            if held and isinstance(outcome, tuple) and isinstance(outcome[1], Later):  # the EHR is still to answer
                outcome[1].release, held = lambda: cap.release(clinic), False
            return outcome
        finally:
            if held:
                cap.release(clinic)
    except ApiError as exc:
        recording.skip()
        return exc, None
    except BaseException:
        recording.skip()
        raise


def _count(runtime, caller: Caller, admission: Admission) -> None:
    """Count the request against the caller's limits (one limiter call): 429 when over one."""
    limits = counters(runtime.settings, caller)
    try:
        decision = runtime.rate_limiter.hit_all_now(limits)
    except RateLimiterUnavailable:
        raise FhirError(503, "transient", "The rate limiter's store cannot be reached; the request was not "
                                          "processed. Retry shortly.",
                        {"Retry-After": str(LIMITER_RETRY_AFTER)}) from None
    admission.limit_headers = decision.headers()
    if not decision.allowed:
        admission.refused_by = decision.key.split(":", 1)[0]
        raise FhirError(429, "throttled", refusal_message(decision, dict(limits)[decision.key].seconds),
                        admission.limit_headers)
