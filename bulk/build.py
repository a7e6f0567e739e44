"""Building an export (on a task worker, `workers.export`): its types, one at a time, into the object store.

For each type not yet done: the type's resources, read through the clinic's connector held to its
batch bounds (a fresh connector per page of patients), with the very search the FHIR API runs
(`connectors.base.ResourceQuery` of the patient; the sandbox renders with `connectors.sandbox.render`,
the FHIR EHR answers, and what a real EHR sends passes the one matcher `connectors.matching.matches`),
then `_since`, `_typeFilter` (the FHIR API's search parser, lenient) and `_elements`, written by
`bulk.files.TypeWriter`. Before a patient's search (and a directory type's) the build checks, with
one indexed read, that its delivery still holds the job, unless it checked less than `HOLDS_SECONDS`
ago: a job DELETEd meanwhile (`cancel_export`) stops it within one search of a networked EHR (or
`HOLDS_SECONDS` of the sandbox's quick ones), not at its next checkpoint. A FHIR clinic whose EHR
offers Bulk Data export reads the types it can from that export instead (`bulk.ehr_export`), and
falls back to the searches when it fails. Each stored part is recorded in the job's transaction
only while this delivery holds the job's lease (`owner`); a job deleted or taken over meanwhile
(`ExportGone`) stops the build and its just-stored object is removed.
"""
from __future__ import annotations

import datetime as dt
import logging
import math
import time

from bulk.ehr_export import EhrSource, Gone, delete_ehr_job
from bulk.files import Part, TypeWriter, export_prefix, temporary_directory
from bulk.groups import CLINIC_GROUP, members
from bulk.params import PATIENT_TYPES, ExportParameters, type_filter_args
from connectors import Bounds, ConnectorError, PatientNotFound, ResourceNotFound, ResourceQuery, connector_for
from connectors.matching import matches
from fhir_api import fhir_base_url
from fhir_api.search import parse_search
from models.bulk import BulkExport, BulkExportFile

log = logging.getLogger("svc_auth.bulk")
HOLDS_SECONDS = 0.05
"""A build asks `holds` before a search only once this long has passed since it last asked: before
each search that takes longer (a networked EHR's), once per ~100 of the sandbox's (~0.5 ms each)."""


class ExportGone(Exception):
    """The job was deleted, finished or taken over by another delivery while this one built it."""


def _live(export_id: str, owner: str):
    return ((BulkExport.id == export_id) & (BulkExport.status == "pending") & (BulkExport.lease_owner == owner))


def holds(export_id: str, owner: str) -> bool:
    """Does delivery `owner` still hold the pending job (not deleted, not taken over)? One indexed read."""
    return BulkExport.select(BulkExport.id).where(_live(export_id, owner)).exists()


def at_most_every(seconds: float, check):
    """`check()`, asked only when `seconds` have passed since it last was (True in between)."""
    last = -math.inf

    def live() -> bool:
        nonlocal last
        now = time.monotonic()
        if now - last < seconds:
            return True
        last = now
        return check()
    return live


def record_part(runtime, export_id: str, owner: str, part: Part) -> None:
    """Record a stored part, or remove it and raise `ExportGone` when the job is no longer ours."""
    with runtime.db.atomic():
        held = BulkExport.update(resources_written=BulkExport.resources_written + part.count).where(
            _live(export_id, owner)).execute()
        if held:
            BulkExportFile.create(export=export_id, resource_type=part.resource_type, part=part.part,
                                  object_key=part.object_key, count=part.count, size=part.size,
                                  patients=list(part.patients))
    if not held:
        runtime.batch_object_store.delete(part.object_key)
        raise ExportGone(export_id)


def forget_unfinished_types(runtime, job: BulkExport) -> None:
    """Before a delivery (re)starts: the files of types not done (a killed delivery's) are removed,
    and the progress counts only the done types'."""
    done = list(job.done_types or ())
    stale = list(BulkExportFile.select().where((BulkExportFile.export == job.id)
                                               & BulkExportFile.resource_type.not_in(done or [""])))
    for row in stale:
        runtime.batch_object_store.delete(row.object_key)
    if stale:
        BulkExportFile.delete().where(BulkExportFile.id.in_([r.id for r in stale])).execute()
    written = sum(r.count for r in BulkExportFile.select(BulkExportFile.count).where(BulkExportFile.export == job.id))
    BulkExport.update(resources_written=written).where(BulkExport.id == job.id).execute()


def patient_batches(job: BulkExport, params: ExportParameters):
    """The job's patients in pages: its Group's (the clinic's for a system or Patient export),
    narrowed to the `patient` parameter's."""
    wanted = set(params.patients) if params.patients is not None else None
    group = job.group_id if job.level == "group" else CLINIC_GROUP
    for batch in members(job.organization_id, group):
        if wanted is not None:
            batch = [p for p in batch if p in wanted]
        if batch:
            yield batch


def _since_ok(resource: dict, since: dt.datetime | None) -> bool:
    """`_since`: a resource whose `meta.lastUpdated` is before it is left out (one without is kept)."""
    if since is None:
        return True
    updated = (resource.get("meta") or {}).get("lastUpdated")
    if not isinstance(updated, str):
        return True
    try:
        moment = dt.datetime.fromisoformat(updated.replace("Z", "+00:00"))
        if moment.tzinfo is not None:
            moment = moment.astimezone(dt.timezone.utc).replace(tzinfo=None)
    except (ValueError, OverflowError):  # unreadable, or its UTC outside years 1-9999: kept, as one without
        return True
    return moment >= since


def _search(connector, query: ResourceQuery):
    found = connector.search_resources(query)
    if not connector.answers_matched:
        found = (r for r in found if matches(r, query))
    return found


def type_resources(runtime, job: BulkExport, params: ExportParameters, kind: str, ehr=None, live=lambda: True):
    """Every resource of `kind` the job exports, lazily (filters applied; `_elements` not yet):
    from the EHR's own export (`ehr`, a `bulk.ehr_export.EhrSource`) when it has the type, else
    through the connector, `live()` asked before each search (False: `ExportGone`)."""
    base = fhir_base_url(runtime.settings, job.organization_id)
    filters = [parse_search(kind, type_filter_args(q), base) for of, q in params.type_filters if of == kind]
    filters = [f.query for f in filters if not f.unmatchable]
    has_filters = any(of == kind for of, _ in params.type_filters)
    since = params.since_datetime()

    def kept(resource: dict) -> bool:
        if not _since_ok(resource, since):
            return False
        return not has_filters or any(matches(resource, query) for query in filters)

    bounds = Bounds.batch(runtime.settings)
    if ehr is not None and kind in ehr.types:
        yield from filter(kept, ehr.resources(kind))
    elif kind in PATIENT_TYPES:
        for batch in patient_batches(job, params):
            connector = connector_for(runtime, job.organization, bounds)
            for patient in batch:
                if not live():
                    raise ExportGone(job.id)
                try:
                    yield from filter(kept, _search(connector, ResourceQuery(kind, patient=patient, count=100)))
                except (PatientNotFound, ResourceNotFound):
                    continue
    else:
        if not live():
            raise ExportGone(job.id)
        connector = connector_for(runtime, job.organization, bounds)
        yield from filter(kept, _search(connector, ResourceQuery(kind, count=100)))


def _write_type(runtime, job: BulkExport, params: ExportParameters, kind: str, owner: str, ehr=None) -> None:
    """Write and record every file of one type."""
    settings = runtime.settings
    live = at_most_every(HOLDS_SECONDS, lambda: holds(job.id, owner))
    with temporary_directory() as directory:
        writer = TypeWriter(runtime.batch_object_store, job.id, kind, settings.bulk_file_max_bytes,
                            lambda part: record_part(runtime, job.id, owner, part), directory, params.elements)
        try:
            for resource in type_resources(runtime, job, params, kind, ehr, live):
                writer.add(resource)  # subset there, after its patients are taken from the whole resource
            writer.close()
        finally:
            if not writer.handle.closed:
                writer.handle.close()


def _ehr_state(export_id: str, owner: str):
    """`live(state)` for `bulk.ehr_export.EhrSource`: keep `state` in the job (None: only check),
    True while this delivery still holds the job."""
    def live(state) -> bool:
        if state is None:
            return holds(export_id, owner)
        return bool(BulkExport.update(ehr_export=state).where(_live(export_id, owner)).execute())
    return live


def _fall_back(runtime, job: BulkExport, owner: str, ehr, reason: str) -> None:
    """The EHR's export failed: keep that in the job, DELETE it at the EHR, and drop what the
    type being written had recorded (it is written again through the connector)."""
    log.warning("export %s: the EHR's own $export failed (%s): reading the EHR per patient", job.id, reason)
    ehr.finish()
    if not _ehr_state(job.id, owner)({"fallback": reason[:500]}):
        raise ExportGone(job.id)
    job.ehr_export = {"fallback": reason[:500]}
    forget_unfinished_types(runtime, BulkExport.get_by_id(job.id))


def build_export(runtime, export_id: str, owner: str) -> None:
    """Write every type not done of a pending job whose lease `owner` holds, then complete it."""
    job = BulkExport.get_or_none(BulkExport.id == export_id)
    if job is None or job.status != "pending":
        return
    params = ExportParameters.from_json(job.parameters)
    forget_unfinished_types(runtime, job)
    done = list(job.done_types or ())
    settings = runtime.settings
    ehr = EhrSource.open(runtime, job, params, owner, patient_batches(job, params), _ehr_state(export_id, owner))
    for kind in params.types:
        if kind in done:
            continue
        try:
            _write_type(runtime, job, params, kind, owner, ehr)
        except Gone:
            raise ExportGone(export_id) from None
        except ConnectorError as exc:
            if ehr is None or kind not in ehr.types:
                raise
            _fall_back(runtime, job, owner, ehr, str(exc))
            ehr = None
            _write_type(runtime, job, params, kind, owner)
        done.append(kind)
        if not BulkExport.update(done_types=done).where(_live(export_id, owner)).execute():
            raise ExportGone(export_id)
    if ehr is not None:
        ehr.finish()
    now = runtime.clock.now()
    if not BulkExport.update(status="complete", completed_at=now,
                             expires_at=now + dt.timedelta(seconds=settings.bulk_file_ttl),
                             lease_owner=None, lease_until=None,
                             **({"ehr_export": {"done": True}} if ehr is not None else {})
                             ).where(_live(export_id, owner)).execute():
        raise ExportGone(export_id)
    log.info("export %s complete", export_id)


def mark_failed(runtime, export_id: str, message: str, status: int = 500) -> None:
    now = runtime.clock.now()
    (BulkExport.update(status="failed", error=message, error_status=status, completed_at=now,
                       expires_at=now + dt.timedelta(seconds=runtime.settings.bulk_file_ttl))
     .where((BulkExport.id == export_id) & (BulkExport.status == "pending")).execute())


def _delete_objects(runtime, export_id: str, keys=()) -> None:
    store = runtime.object_store
    for key in dict.fromkeys([*keys, *store.list_keys(export_prefix(export_id))]):  # a part stored, not yet recorded, too
        store.delete(key)


def _drop_files(runtime, job: BulkExport | None, export_id: str, change) -> int:
    """Remove a job's objects (those its rows name and any other under its prefix), then its file rows
    and apply `change` (a query on its row) in one transaction, and DELETE the EHR's own export it had
    kicked off (`bulk.ehr_export`); `change`'s count. A store that fails raises before any row goes:
    the next sweep or DELETE finds the rows and tries again (docs/workers.md: objects, then rows)."""
    keys = [row.object_key for row in BulkExportFile.select(BulkExportFile.object_key)
            .where(BulkExportFile.export == export_id)]
    _delete_objects(runtime, export_id, keys)
    with runtime.db.atomic():
        BulkExportFile.delete().where(BulkExportFile.export == export_id).execute()
        changed = change.execute()
    if job is not None and job.ehr_export:
        delete_ehr_job(runtime, job.organization, job.ehr_export)
    return changed


def delete_export(runtime, export_id: str) -> bool:
    """Remove a job: a pending one is `cancelled` first, so no delivery records a part from then on (one
    still writing removes its own: `record_part`), then its objects, then its rows, and DELETE the
    EHR's own export it had kicked off."""
    BulkExport.update(status="cancelled").where((BulkExport.id == export_id)
                                                & (BulkExport.status == "pending")).execute()
    job = BulkExport.get_or_none(BulkExport.id == export_id)
    return bool(_drop_files(runtime, job, export_id, BulkExport.delete().where(BulkExport.id == export_id)))


def cancel_export(runtime, export_id: str) -> bool:
    """`DELETE` of a job: its files (and the EHR's own export) go now. A pending job a delivery is
    building stays, `cancelled`, until that build stops (`forget_cancelled`: within one EHR search) or
    its lease lapses (the sweep), so it still counts against the app's concurrent exports while
    the build runs; any other job's row goes now. False: no such job (or already cancelled)."""
    if not BulkExport.update(status="cancelled").where((BulkExport.id == export_id)
                                                       & (BulkExport.status == "pending")).execute():
        job = BulkExport.get_or_none(BulkExport.id == export_id)
        return job is not None and job.status != "cancelled" and delete_export(runtime, export_id)
    job = BulkExport.get_or_none(BulkExport.id == export_id)  # no delivery can claim it from now on
    if job is None:
        return True
    if job.lease_owner is None or job.lease_until is None or job.lease_until < runtime.clock.now():
        delete_export(runtime, export_id)  # queued, or its worker dead: nothing builds it
        return True
    _drop_files(runtime, job, export_id, BulkExport.update(ehr_export=None).where(BulkExport.id == export_id))
    return True


def forget_cancelled(runtime, export_id: str, owner: str) -> None:
    """A build stopped (`ExportGone`) or a delivery started on a job cancelled while `owner` held
    it: the job and whatever the build left in the object store go now."""
    if BulkExport.select(BulkExport.id).where((BulkExport.id == export_id) & (BulkExport.status == "cancelled")
                                              & (BulkExport.lease_owner == owner)).exists():
        delete_export(runtime, export_id)
