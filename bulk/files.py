"""An export's ndjson files: one type at a time, streamed through a temporary file into the object store.

`TypeWriter` writes one resource per line (compact JSON, orjson) into a temporary file; past
SVC_BULK_FILE_MAX_BYTES the type goes on in a new part. A part is put into the store all or
nothing (`ObjectStore.put_file`: a local rename, an S3 PutObject or a completed multipart upload),
checked to be there, and only then handed to `on_part` (the job records it). Each part keeps the
patients its resources belong to (`connectors.compartment.patients_of`, of each whole resource,
before `_elements` subsets it: a `subject` left out still names its patient): its downloads name them.
Memory holds one resource and one part's patient ids, whatever the number of patients.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass

import orjson
from types import MappingProxyType

from connectors.compartment import patients_of

SUBSETTED = MappingProxyType({"system": "http://terminology.hl7.org/CodeSystem/v3-ObservationValue", "code": "SUBSETTED"})
EXPORT_PREFIX = "bulk/"


def export_prefix(export_id: str) -> str:
    return f"{EXPORT_PREFIX}{export_id}/"


def file_name(resource_type: str, part: int) -> str:
    return f"{resource_type}-{part}.ndjson"


def file_key(export_id: str, resource_type: str, part: int) -> str:
    return export_prefix(export_id) + file_name(resource_type, part)


def ndjson_line(resource: dict) -> bytes:
    try:
        return orjson.dumps(resource) + b"\n"
    except TypeError:
        return json.dumps(resource, separators=(",", ":")).encode() + b"\n"


def subset(resource: dict, elements: tuple[tuple[str | None, str], ...]) -> dict:
    """`_elements`: the resource with only the elements named for its type (or every type), its
    `resourceType`, `id` and `meta`, and `meta.tag` SUBSETTED; unchanged when none apply."""
    kind = resource.get("resourceType")
    keep = {name for of, name in elements if of in (None, kind)}
    if not keep:
        return resource
    kept = {k: v for k, v in resource.items() if k in keep or k in ("resourceType", "id", "meta")}
    meta = dict(kept["meta"]) if isinstance(kept.get("meta"), dict) else {}  # an EHR's may be malformed
    tags = meta.get("tag") if isinstance(meta.get("tag"), list) else []
    meta["tag"] = [t for t in tags if isinstance(t, dict) and t.get("code") != "SUBSETTED"] + [dict(SUBSETTED)]
    kept["meta"] = meta
    return kept


@dataclass(frozen=True)
class Part:
    """A complete file in the store."""

    resource_type: str
    part: int
    object_key: str
    count: int
    size: int
    patients: tuple[str, ...]


class TypeWriter:
    """Writes one type's resources (each subset by `elements`, `_elements`) into parts of at most
    `max_bytes` (past one resource), each put into `store` under `file_key(export_id, type, n)` and
    passed to `on_part(Part)` once stored."""

    def __init__(self, store, export_id: str, resource_type: str, max_bytes: int, on_part, directory: str,
                 elements: tuple[tuple[str | None, str], ...] = ()):
        self.store, self.export_id, self.resource_type = store, export_id, resource_type
        self.max_bytes, self.on_part, self.directory = max_bytes, on_part, directory
        self.elements = elements
        self.part = 0
        self._open()

    def _open(self) -> None:
        self.part += 1
        self.path = os.path.join(self.directory, file_name(self.resource_type, self.part))
        self.handle = open(self.path, "wb")
        self.count = self.size = 0
        self.patients: dict[str, None] = {}

    def add(self, resource: dict) -> None:
        """Write `resource` (subset by `elements`); its patients are the whole resource's."""
        line = ndjson_line(subset(resource, self.elements) if self.elements else resource)
        if self.count and self.size + len(line) > self.max_bytes:
            self._finish()
            self._open()
        self.handle.write(line)
        self.count += 1
        self.size += len(line)
        for patient in patients_of(resource):
            self.patients[patient] = None

    def _finish(self) -> None:
        self.handle.close()
        key = file_key(self.export_id, self.resource_type, self.part)
        self.store.put_file(key, self.path)
        if not self.store.exists(key):
            raise OSError(f"{key} is not in the object store after its upload")
        os.unlink(self.path)
        self.on_part(Part(self.resource_type, self.part, key, self.count, self.size, tuple(self.patients)))

    def close(self) -> None:
        """Store the last part (a type with no resource writes no file)."""
        if self.count:
            self._finish()
        else:
            self.handle.close()
            os.unlink(self.path)


def temporary_directory():
    return tempfile.TemporaryDirectory(prefix="svc-bulk-")
