"""Bulk Data export and Groups on each clinic's FHIR base (`/fhir/r4/{svcOrganizationId}`); docs/bulk-data.md.

Thin: `bulk.api` decides. Each request is one pool job of the FHIR API's admission
(`fhir_api.admission.answer`: the token, the caller's CORS, the limits, then the domain call).
- `GET|POST {iss}/$export`, `{iss}/Patient/$export`, `{iss}/Group/{id}/$export`: kick-off
  (`Accept: application/fhir+json` and `Prefer: respond-async` required): 202 + Content-Location.
- `GET|DELETE {iss}/$export-status/{id}`: the status URL (`application/json`, errors included).
- `GET {iss}/$export-file/{id}/{Type}-{n}.ndjson`: a file (`application/fhir+ndjson`), streamed; its
  disclosure record (`bulk.download`, every patient in the file) is committed before the first byte.
- `GET {iss}/Group`, `{iss}/Group/{id}`: the clinic's Groups (`bulk.groups`).
"""
from __future__ import annotations

from errors import ApiError
from bulk.api import cancel, export_status, kick_off, open_file, read_group, search_groups
from bulk.params import lenient_handling, parameters_body, post_arguments, query_values, respond_async
from fhir_api import FHIR_PATH_PREFIX, fhir_base_url
from fhir_api.outcome import FhirError, invalid, operation_outcome
from fhir_api.search import search_arguments, strict_handling
from handlers.base import JsonBodyError, json_document
from handlers.fhir import FhirHandler, fhir_json
from models.fhir_grammar import is_resource_type
from workers.export import enqueue_export

CHUNK = 256 * 1024
NDJSON = "application/fhir+ndjson"


def _group_patients(value: dict):
    """What a Group answer discloses: its members (and, for a search, every Group's)."""
    groups = [e["resource"] for e in value.get("entry", ())] if value.get("resourceType") == "Bundle" else [value]
    patients = [m["entity"]["reference"].rpartition("/")[2] for g in groups for m in g.get("member", ())]
    return patients, [g["id"] for g in groups]


def _unrecorded(fn):
    """`fn` whose refusal is returned, not raised: a status poll or DELETE discloses no patient data,
    so neither its success nor its failure is a disclosure record (`Recording.call` records raised ones)."""
    def call(runtime, caller, *args):
        try:
            return None, fn(runtime, caller, *args)
        except ApiError as exc:
            return exc, None
    return call


class BulkHandler(FhirHandler):
    """The FHIR API's admission around a `bulk.api` call."""

    async def options(self, organization_id, *rest):
        await super().options()  # CORS preflight: the caller's registered origins (handlers.cors)

    async def admit(self, organization_id: str, action: str, resource_type: str, path_id, describe, fn, *args,
                    status: int = 200):
        self.check_organization(organization_id)
        # uses_ehr=False: the EHR is read by the worker, not here
        return await self.answered(organization_id, action, resource_type, path_id, {}, lambda: None, describe, fn,
                                   *args, uses_ehr=False, status=status)


class KickoffHandler(BulkHandler):
    """`GET|POST {iss}/$export`, `{iss}/Patient/$export`, `{iss}/Group/{id}/$export`."""

    level = "system"

    def _checks(self) -> tuple[bool, bool]:
        headers = self.request.headers
        accepts = [part.split(";")[0].strip().lower() for part in (headers.get("Accept") or "").split(",")]
        if "application/fhir+json" not in accepts:
            raise invalid("A kick-off needs Accept: application/fhir+json.")
        prefer = headers.get("Prefer")
        if not respond_async(prefer):
            raise invalid("A kick-off needs Prefer: respond-async.")
        return lenient_handling(prefer), True

    def _post_args(self) -> dict:
        content_type = (self.request.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if content_type not in ("application/fhir+json", "application/json"):
            raise FhirError(415, "not-supported", "A POST kick-off's body is a Parameters resource sent as "
                                                  "application/fhir+json or application/json.")
        try:
            body = json_document((self.request.body or b"").decode("utf-8"))
        except UnicodeDecodeError:
            raise invalid("The body is not valid JSON.") from None
        except JsonBodyError as exc:
            raise invalid(str(exc)) from None
        return parameters_body(body)

    async def _kick_off(self, organization_id: str, group_id: str | None, from_post: bool):
        self.check_organization(organization_id)
        lenient, _ = self._checks()
        args = query_values(self.request.query_arguments)
        if from_post:
            args = post_arguments(args, self._post_args())
        base = fhir_base_url(self.svc_settings, organization_id)
        # The path as sent after the clinic's segment (which Tornado gave decoded: `%61bc` is `abc`).
        suffix = self.request.path[len(FHIR_PATH_PREFIX) + 1:].partition("/")[2]
        request_url = f"{base}/{suffix}" + (f"?{self.request.query}" if self.request.query else "")
        url = await self.admit(organization_id, "bulk.kickoff", "", None,
                               lambda url: ((), (url.rpartition("/")[2],)),
                               kick_off, organization_id, self.level, group_id, args, lenient, from_post, request_url,
                               enqueue_export, status=202)
        self.set_status(202)
        self.set_header("Content-Location", url)
        self.set_header("Content-Type", "application/fhir+json; charset=UTF-8")
        self.no_store()
        self.finish(fhir_json(operation_outcome("informational", f"Export started; poll {url}", "information")))

    async def get(self, organization_id, group_id=None):
        await self._kick_off(organization_id, group_id, False)

    async def post(self, organization_id, group_id=None):
        await self._kick_off(organization_id, group_id, True)


class PatientKickoffHandler(KickoffHandler):
    level = "patient"


class GroupKickoffHandler(KickoffHandler):
    level = "group"


class StatusHandler(BulkHandler):
    """`GET|DELETE {iss}/$export-status/{id}`: answers `application/json`."""

    def write_fhir(self, value: dict) -> None:
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        self.no_store()
        self.finish(fhir_json(value))

    async def get(self, organization_id, export_id):
        error, found = await self.admit(organization_id, "bulk.status", "", None, lambda _: None,
                                        _unrecorded(export_status), organization_id, export_id)
        if error is not None:
            raise error
        status, headers, body = found
        self.set_status(status)
        for name, value in headers.items():
            self.set_header(name, value)
        # In progress: an informational OperationOutcome (a JSON body, as every answer of this URL).
        self.write_fhir(body if body is not None else
                        operation_outcome("informational", f"In progress: {headers['X-Progress']}.", "information"))

    async def delete(self, organization_id, export_id):
        error, _ = await self.admit(organization_id, "bulk.delete", "", None, lambda _: None, _unrecorded(cancel),
                                    organization_id, export_id)
        if error is not None:
            raise error
        self.set_status(202)
        self.write_fhir(operation_outcome("informational", "The export and its files are deleted.", "information"))


class FileHandler(BulkHandler):
    """`GET {iss}/$export-file/{id}/{Type}-{n}.ndjson`."""

    async def get(self, organization_id, export_id, name):
        kind = name.partition("-")[0]
        kind = kind if is_resource_type(kind) else ""  # the record names a type, never the path's other text
        stream, size, _, _ = await self.admit(organization_id, "bulk.download", kind, None,
                                              lambda found: (found[2], ()),
                                              open_file, organization_id, export_id, name)
        try:
            self.set_header("Content-Type", NDJSON)
            self.set_header("Content-Length", str(size))
            self.set_header("Cache-Control", "private, no-store")
            while chunk := await self.run(stream.read, CHUNK):
                self.write(chunk)
                await self.flush()
        finally:
            await self.run(stream.close)
        self.finish()


class GroupSearchHandler(BulkHandler):
    async def get(self, organization_id):
        self.accept_json()
        strict = strict_handling(self.request.headers.get("Prefer"))
        raw = self.search_args()  # parsed on the pool: a 400 is recorded too
        self.write_fhir(await self.admit(organization_id, "search", "Group", None, _group_patients,
                                         lambda runtime, caller: search_groups(
                                             runtime, caller, organization_id, search_arguments(raw), strict)))


class GroupReadHandler(BulkHandler):
    async def get(self, organization_id, group_id):
        self.accept_json()
        self.write_fhir(await self.admit(organization_id, "read", "Group", group_id, _group_patients,
                                         read_group, organization_id, group_id))


def routes(runtime) -> list:
    base = rf"{FHIR_PATH_PREFIX}/([^/]+)"
    return [
        (rf"{base}/\$export", KickoffHandler),
        (rf"{base}/Patient/\$export", PatientKickoffHandler),
        (rf"{base}/Group/([^/]+)/\$export", GroupKickoffHandler),
        (rf"{base}/\$export-status/([^/]+)", StatusHandler),
        (rf"{base}/\$export-file/([^/]+)/([^/]+)", FileHandler),
        (rf"{base}/Group", GroupSearchHandler),
        (rf"{base}/Group/([^/]+)", GroupReadHandler),
    ]
