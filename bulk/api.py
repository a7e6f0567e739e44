"""The Bulk Data API of one clinic's FHIR base, as plain domain functions (`handlers.bulk` awaits them
on the runtime's pool, after the FHIR API's own admission: token, CORS, limits).

- `kick_off`: the checked parameters (`bulk.params`), narrowed to the types the token's scopes
  let it search (a type named in `_type` that they do not is a 403, or left out with
  `handling=lenient`; a `patient/` grant cannot export); at most SVC_BULK_MAX_CONCURRENT exports
  per app in progress (429 + Retry-After): pending ones, and DELETEd ones whose build has not stopped
  yet; the job is committed, then queued (`workers.export.enqueue_export`, passed in): a queue
  that will not take it (Redis down) deletes it again, 503 + Retry-After.
- `export_status`: 202 + `X-Progress` + `Retry-After` while it runs (and at the first poll
  whatever its state), the manifest once complete, the failure's OperationOutcome once failed.
- `cancel`: the job and its files are deleted, its build stopped (`bulk.build.cancel_export`).
- `open_file`: one file's stream, for a token of the exporting app whose scopes let it export (search,
  `EXPORT_PERMISSION`) its type, as the kick-off asks: a read-by-id scope alone downloads nothing.
Only the exporting app's tokens see a job, on the job's clinic; anything else is a 404. Status,
DELETE and files refuse, as the kick-off does (403), a token that reaches one of the job's types
only through a `patient/` scope (`fhir_api.access.patient_scoped`).
"""
from __future__ import annotations

import calendar
import dataclasses
import email.utils
import logging

import peewee

from bulk.build import cancel_export, delete_export
from bulk.groups import check_group, group_ids, group_resource
from bulk.params import ExportParameters, parse_kickoff
from errors import ApiError
from fhir_api import fhir_base_url
from fhir_api.access import grant_for, patient_scoped
from fhir_api.bundle import search_url, searchset
from fhir_api.outcome import FhirError, operation_outcome
from fhir_api.search import parse_search
from models.application import Application
from models.bulk import BulkExport, BulkExportFile
from models.clock import utc_iso
from models.db import DATABASE_ERRORS
from models.ids import is_id

STATUS_SEGMENT = "$export-status"
FILE_SEGMENT = "$export-file"
POLL_SECONDS = 2          # Retry-After of a running export
BUSY_RETRY_AFTER = 60     # Retry-After of a kick-off over the app's concurrent exports
QUEUE_RETRY_AFTER = 5     # Retry-After of a kick-off whose job the task queue (Redis) would not take
EXPORT_PERMISSION = "s"   # an export is a search of each type: its kick-off and its files need the same

log = logging.getLogger("svc_auth.bulk")


def status_url(settings, organization_id: str, export_id: str) -> str:
    return f"{fhir_base_url(settings, organization_id)}/{STATUS_SEGMENT}/{export_id}"


def file_url(settings, organization_id: str, export_id: str, name: str) -> str:
    return f"{fhir_base_url(settings, organization_id)}/{FILE_SEGMENT}/{export_id}/{name}"


def _no_patient_scope(caller, kinds) -> None:
    """403 when the caller reaches one of `kinds` only through a `patient/` scope: such a grant
    cannot export, nor poll, delete or download an export."""
    if any(patient_scoped(caller, kind, EXPORT_PERMISSION) for kind in kinds):
        raise FhirError(403, "forbidden", "A patient/ scope cannot export; a backend app asks for system/ scopes.")


def _grant(caller, kind: str):
    """The caller's search grant on `kind`, or None when its scopes do not reach it (whole clinic only)."""
    _no_patient_scope(caller, (kind,))
    try:
        return grant_for(caller, kind, EXPORT_PERMISSION)
    except ApiError as exc:  # insufficient_scope (oauth.bearer), or a FhirError
        if exc.status == 403:
            return None
        raise


def _scoped(caller, params: ExportParameters, explicit: bool, lenient: bool) -> ExportParameters:
    """`params` with only the types the token may search (a named one it may not: 403 unless lenient)."""
    allowed = tuple(kind for kind in params.types if _grant(caller, kind) is not None)
    refused = [kind for kind in params.types if kind not in allowed]
    if refused and explicit and not lenient:
        raise FhirError(403, "forbidden", f"The token's scopes do not allow search of {', '.join(refused[:5])} "
                                          f"(needs system/{refused[0]}.rs).")
    if not allowed:
        raise FhirError(403, "forbidden", "The token's scopes allow the export of no type here.")
    return dataclasses.replace(params, types=allowed,
                               type_filters=tuple(f for f in params.type_filters if f[0] in allowed))


def kick_off(runtime, caller, organization_id: str, level: str, group_id: str | None, args: dict,
             lenient: bool, from_post: bool, request_url: str, enqueue) -> str:
    """Start an export (`enqueue(runtime, export_id)` queues it once committed: `workers.export`); its status URL."""
    settings, now = runtime.settings, runtime.clock.now()
    if level == "group":
        check_group(organization_id, group_id)
    params = parse_kickoff(level, args, fhir_base_url(settings, organization_id), now, lenient, from_post)
    params = _scoped(caller, params, bool(args.get("_type")), lenient)
    app_id = caller.app.id
    forget_expired(runtime, app_id)
    with runtime.db.atomic():  # SQLite: an IMMEDIATE transaction (models.db), so kick-offs count one at a time
        if not isinstance(runtime.db, peewee.SqliteDatabase):  # PostgreSQL: the app's row, locked, does
            list(Application.select(Application.id).where(Application.id == app_id).for_update())
        running = BulkExport.select().where((BulkExport.application == app_id) & (
            (BulkExport.status == "pending")
            | ((BulkExport.status == "cancelled") & (BulkExport.lease_until >= now)))).count()  # its build not stopped yet
        if running >= settings.bulk_max_concurrent:
            raise FhirError(429, "throttled", f"This application has {running} exports in progress (at most "
                                              f"{settings.bulk_max_concurrent}); retry once one is done or deleted.",
                            {"Retry-After": str(BUSY_RETRY_AFTER)})
        job = BulkExport.create(application=app_id, organization=organization_id,
                                client_id=caller.claims.get("client_id") or "", level=level, group_id=group_id,
                                request_url=request_url, parameters=params.as_json(), transaction_time=now)
    try:
        enqueue(runtime, job.id)
    except Exception:
        # Nobody will know its status URL: it must not count against the app's exports, nor be built.
        log.exception("export %s: could not be queued", job.id)
        BulkExport.delete().where(BulkExport.id == job.id).execute()
        raise FhirError(503, "transient", "The export queue cannot be reached; retry shortly.",
                        {"Retry-After": str(QUEUE_RETRY_AFTER)}) from None
    return status_url(settings, organization_id, job.id)


def forget_expired(runtime, application_id: str) -> None:
    """Delete the app's expired exports now (the recovery sweep of the workers and the scheduler does
    it for every app; this frees the app's expired files at once, whenever the next sweep runs).
    The kick-off needs none of them gone: at the first one the object store will not delete, the
    rest are left to the sweep (logged), and the kick-off goes on."""
    now = runtime.clock.now()
    for job in BulkExport.select(BulkExport.id).where((BulkExport.application == application_id)
                                                      & (BulkExport.status != "pending") & (BulkExport.expires_at < now)):
        try:
            delete_export(runtime, job.id)
        except DATABASE_ERRORS:
            raise
        except Exception:
            log.warning("expired export %s could not be deleted at a kick-off; the sweep tries again",
                        job.id, exc_info=True)
            return


def _job(caller, organization_id: str, export_id: str, now) -> BulkExport:
    """The caller's app's job on this clinic, or 404 (another app's is never revealed); 403 when the
    caller reaches one of its types only through a `patient/` scope (as its kick-off would be)."""
    job = BulkExport.get_or_none(BulkExport.id == export_id) if is_id(export_id) else None
    if (job is None or job.application_id != caller.app.id or job.organization_id != organization_id
            or job.status == "cancelled" or (job.expires_at is not None and job.expires_at < now)):
        raise FhirError(404, "not-found", "No such export (it may have been deleted or have expired).")
    _no_patient_scope(caller, ExportParameters.from_json(job.parameters).types)
    return job


def manifest(settings, job: BulkExport) -> dict:
    files = BulkExportFile.select().where(BulkExportFile.export == job.id).order_by(BulkExportFile.id)
    order = {kind: n for n, kind in enumerate(ExportParameters.from_json(job.parameters).types)}
    rows = sorted(files, key=lambda f: (order.get(f.resource_type, 999), f.part))
    return {"transactionTime": utc_iso(job.transaction_time), "request": job.request_url, "requiresAccessToken": True,
            "output": [{"type": f.resource_type, "count": f.count,
                        "url": file_url(settings, job.organization_id, job.id, f"{f.resource_type}-{f.part}.ndjson")}
                       for f in rows],
            "error": []}


def export_status(runtime, caller, organization_id: str, export_id: str) -> tuple[int, dict, dict | None]:
    """(HTTP status, headers, JSON body) of a status poll."""
    job = _job(caller, organization_id, export_id, runtime.clock.now())
    first = not job.polled
    if first:
        BulkExport.update(polled=True).where(BulkExport.id == job.id).execute()
    if job.status == "pending" or first:
        types = ExportParameters.from_json(job.parameters).types
        progress = (f"{len(job.done_types or ())} of {len(types)} types done, {job.resources_written} resources"
                    if job.status == "pending" else "finishing")
        return 202, {"X-Progress": progress, "Retry-After": str(POLL_SECONDS)}, None
    if job.status == "failed":
        status = job.error_status if job.error_status and job.error_status >= 400 else 500
        return status, {}, operation_outcome("exception" if status >= 500 else "processing", job.error or "failed")
    headers = {"Expires": _http_date(job.expires_at)} if job.expires_at else {}
    return 200, headers, manifest(runtime.settings, job)


def _http_date(moment) -> str:
    return email.utils.formatdate(calendar.timegm(moment.timetuple()), usegmt=True)


def cancel(runtime, caller, organization_id: str, export_id: str) -> None:
    """`DELETE` of the status URL: the job and its files are gone, and its build stops."""
    job = _job(caller, organization_id, export_id, runtime.clock.now())
    if not cancel_export(runtime, job.id):
        raise FhirError(404, "not-found", "No such export.")


def open_file(runtime, caller, organization_id: str, export_id: str, name: str):
    """(stream, size, patients, type) of one file of a complete export; 403 when the token's scopes
    do not let it export (search) its type; 404 for anything not listed in the manifest."""
    job = _job(caller, organization_id, export_id, runtime.clock.now())
    kind, _, rest = name.partition("-")
    part = rest[:-len(".ndjson")] if rest.endswith(".ndjson") else ""
    row = None
    if job.status == "complete" and part.isascii() and part.isdigit() and len(part) < 7:
        row = BulkExportFile.get_or_none((BulkExportFile.export == job.id) & (BulkExportFile.resource_type == kind)
                                         & (BulkExportFile.part == int(part)))
    if row is None:
        raise FhirError(404, "not-found", "No such file in this export.")
    _no_patient_scope(caller, (kind,))
    grant_for(caller, kind, EXPORT_PERMISSION)  # what exported the type: `.r` alone (read by id) downloads none
    try:
        stream, size = runtime.object_store.open_object(row.object_key)
    except FileNotFoundError:
        raise FhirError(404, "not-found", "This file is no longer stored (the export expired).") from None
    return stream, size, list(row.patients or ()), kind


def search_groups(runtime, caller, organization_id: str, args: dict[str, list[str]] | None = None,
                  strict: bool = False) -> dict:
    """`GET {iss}/Group`: the clinic's Groups, searched as the FHIR API searches (`parse_search`):
    `_id` (a comma ORs), `_count` (1 to 100, default 50) and `_offset`, a `next` link while more
    remain; any other parameter ignored and left out of `self` (`strict`: a 400 naming it)."""
    grant_for(caller, "Group", "s")
    base = fhir_base_url(runtime.settings, organization_id)
    args = {name: values for name, values in (args or {}).items() if name != "_format"}
    asked = parse_search("Group", args, base, strict, params={})
    query = asked.query
    found = [gid for gid in group_ids(organization_id) if not query.ids or gid in query.ids]
    page = [group_resource(organization_id, gid) for gid in found[query.offset:query.offset + query.count]]
    more = query.offset + query.count < len(found)
    next_url = search_url(base, "Group", asked.applied, _count=query.count,
                          _offset=query.offset + query.count) if more else None
    return searchset(base, page, len(found), search_url(base, "Group", asked.applied), next_url)


def read_group(runtime, caller, organization_id: str, group_id: str) -> dict:
    grant_for(caller, "Group", "r")
    if not is_id(group_id):
        raise FhirError(404, "not-found", "No such Group.")
    return group_resource(organization_id, group_id)
