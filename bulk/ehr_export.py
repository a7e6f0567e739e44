"""A FHIR clinic's export read from its EHR's own Bulk Data `$export` (`bulk.build` asks `EhrSource.open`).

Used when the clinic is on `fhir`, the EHR's CapabilityStatement (kept per clinic:
`fhir_api.clinic_capability.clinic_view`) offers Bulk Data export, svc-auth's token there grants
some of the Patient-compartment types asked (`connectors.fhir.grants.export_types`), and the job
has at most `MAX_PATIENTS` patients. Then one `Patient/$export` at the EHR (`patient`: the job's
patients; `_type`: those types; `_since` passed through) is kicked off on the first type written,
its status URL kept in the job (`BulkExport.ehr_export`) so a delivery after a worker kill -9 polls
the same EHR job, polled honouring `Retry-After` within the batch bounds (at most `WAIT_SECONDS`
in all); a job the EHR no longer knows (404/410) is DELETEd there and kicked off anew a poll
interval later, at most `MAX_RESTARTS` times per delivery. Each of its ndjson files of a type is
streamed a line at a time into the job's `bulk.files.TypeWriter`. Each line is kept only when it
is of the type, and every patient it references is one of the job's
(`connectors.compartment.patients_of`): an EHR that ignores `patient`, or sends another clinic's
patient, passes nothing of them. References are made relative
(`relative_references`), then `_since`, `_typeFilter` and `_elements` apply as on the per-patient
path. The other types (not granted, not in the compartment) take the per-patient path.

Any failure of the EHR's export (its kick-off refused, e.g. the `patient` parameter; an error
status or an error manifest; a file elsewhere than the EHR's origin; a wait past `WAIT_SECONDS`; a
job forgotten again after its restart; a 5xx or timeout past the connector's retries) makes the
job fall back to the per-patient path for every type not done (`{"fallback": reason}` kept in the
job, logged); that path then succeeds, retries or fails as it always does. The EHR's job is
DELETEd once this job is done, falls back, or is deleted (`bulk.build.delete_export`).
"""
from __future__ import annotations

import logging
import time

import orjson

from bulk.params import PATIENT_TYPES, ExportParameters
from connectors import Bounds, ConnectorError, connector_for
from connectors.compartment import patients_of
from connectors.fhir.bulk_client import DEFAULT_POLL_SECONDS, EhrBulkExport, EhrExportFailed
from connectors.fhir.grants import export_types
from connectors.fhir.mapping import relative_references
from fhir_api.clinic_capability import clinic_view
from fhir_api.outcome import FhirError
from models.bulk import BulkExport

log = logging.getLogger("svc_auth.bulk")
MAX_PATIENTS = 1000      # a job with more patients reads its EHR per patient (one `patient` list per EHR job)
WAIT_SECONDS = 3600      # the longest svc-auth waits for the EHR's export to complete
MAX_RESTARTS = 1         # kick-offs anew per delivery after the EHR forgot its export (404/410 to a poll)


class EhrSource:
    """The EHR's own export of one job: `types` come from it; `resources(kind)` streams them."""

    def __init__(self, runtime, job: BulkExport, params: ExportParameters, owner: str, patients: list[str],
                 types: tuple[str, ...], live):
        self.runtime, self.job, self.params, self.owner = runtime, job, params, owner
        self.patients, self.allowed, self.types, self.live = patients, frozenset(patients), types, live
        self.manifest: dict | None = None
        self.bulk = EhrBulkExport(connector_for(runtime, job.organization, Bounds.batch(runtime.settings)).client)

    @classmethod
    def open(cls, runtime, job: BulkExport, params: ExportParameters, owner: str, batches, live):
        """The job's EHR source, or None when its EHR's export is not to be used (see the module)."""
        state = job.ehr_export or {}
        organization = job.organization
        if organization.ehr != "fhir" or state.get("fallback"):
            return None
        asked = tuple(t for t in params.types if t in PATIENT_TYPES)
        if not asked:
            return None
        if not state.get("status_url"):
            try:
                view = clinic_view(runtime, organization)
            except FhirError:
                return None  # the EHR cannot say what it offers now: the per-patient path (retried as always)
            if not view.get("bulk_export"):
                return None
        patients = []
        for batch in batches:
            patients += batch
            if len(patients) > MAX_PATIENTS:
                log.info("export %s: %d+ patients, more than one EHR export's patient list: read per patient",
                         job.id, MAX_PATIENTS)
                return None
        if not patients:
            return None
        try:
            source = cls(runtime, job, params, owner, patients, (), live)
            granted = source.bulk.client.granted_types()
        except ConnectorError as exc:
            log.warning("export %s: no token at the EHR for its $export (%s): read per patient", job.id, exc)
            return None
        source.types = export_types(asked, granted)
        return source if source.types else None

    # -- the EHR's job ---------------------------------------------------------------------------
    def _ensure_manifest(self) -> dict:
        if self.manifest is not None:
            return self.manifest
        status_url = (self.job.ehr_export or {}).get("status_url")
        deadline = time.monotonic() + WAIT_SECONDS
        restarts = 0
        while True:
            if not status_url:
                status_url = self.bulk.kick_off(self.types, self.params.since, self.patients)
                if not self.live({"status_url": status_url}):
                    self.bulk.delete(status_url)
                    raise Gone(self.job.id)
                self.job.ehr_export = {"status_url": status_url}
                log.info("export %s: the EHR's own $export kicked off (%s)", self.job.id, ", ".join(self.types))
            try:
                state, value = self.bulk.poll(status_url)
            except LookupError as exc:  # the EHR forgot it (expired after a long outage): once more from the start
                restarts += 1
                if restarts > MAX_RESTARTS:
                    raise EhrExportFailed(f"{exc} It forgot the one kicked off anew too.") from None
                self.bulk.delete(status_url)
                self.job.ehr_export = None
                status_url, state, value = None, "forgotten", DEFAULT_POLL_SECONDS
            if state == "complete":
                self.manifest = value
                return value
            if time.monotonic() + value > deadline:
                raise EhrExportFailed(f"The EHR's export did not complete within {WAIT_SECONDS} s.")
            if not self.live(None):
                if status_url:
                    self.bulk.delete(status_url)
                raise Gone(self.job.id)
            time.sleep(value)

    def resources(self, kind: str):
        """The resources of `kind` in the EHR's files, each of the job's patients only, references
        relative to the platform (filters other than the patients' are the caller's)."""
        manifest = self._ensure_manifest()
        base = self.bulk.client.base
        with_token = manifest.get("requiresAccessToken") is not False
        deadline = time.monotonic() + WAIT_SECONDS
        left_out = 0
        for url in self.bulk.files(manifest, kind):
            for line in self.bulk.lines(url, with_token, deadline):
                try:
                    resource = orjson.loads(line)
                except orjson.JSONDecodeError:
                    raise EhrExportFailed(f"The EHR's file of {kind} holds a line that is not JSON.") from None
                if not isinstance(resource, dict) or resource.get("resourceType") != kind:
                    left_out += 1
                    continue
                named = patients_of(resource, base)
                if not named or not self.allowed.issuperset(named):
                    left_out += 1
                    continue
                yield relative_references(resource, base)
        if left_out:
            log.warning("export %s: %d %s line(s) of the EHR's export left out (another type, or a patient not "
                        "of this export)", self.job.id, left_out, kind)

    def finish(self) -> None:
        """The job is done with the EHR's export: DELETE it there."""
        status_url = (self.job.ehr_export or {}).get("status_url")
        if status_url:
            self.bulk.delete(status_url)


class Gone(Exception):
    """The job was deleted or taken over while it waited for the EHR (`bulk.build` raises `ExportGone`)."""


def delete_ehr_job(runtime, organization, ehr_export) -> None:
    """DELETE the EHR's export a deleted job had kicked off (best effort; interactive bounds)."""
    status_url = (ehr_export or {}).get("status_url") if isinstance(ehr_export, dict) else None
    if not status_url or organization is None or organization.ehr != "fhir":
        return
    try:
        client = connector_for(runtime, organization, Bounds.interactive(runtime.settings)).client
    except ConnectorError as exc:
        log.warning("the EHR's export %s could not be deleted: %s", status_url[:200], exc)
        return
    EhrBulkExport(client).delete(status_url)
