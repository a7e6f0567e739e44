"""Object store for chart ZIPs: one interface, two stores chosen by configuration alone.

- `LocalObjectStore` (embedded default): files under `var/objects/`; download URLs are
  HMAC-signed, expiring URLs served by the service itself (`handlers/objects.py`).
- `S3ObjectStore` (`SVC_S3_BUCKET`, optional `SVC_S3_ENDPOINT_URL`): boto3 against AWS S3, MinIO or
  any S3-compatible server; download URLs are presigned GET URLs.

Both only ever make an object visible complete, and write nothing that can outlive its upload
unnoticed: the local store writes a temporary file beside the target and renames it; S3 sends a
small object as one atomic `PutObject` straight to its key, and a large one as a multipart upload,
which is invisible until completed. What a killed writer leaves behind (a temporary file, an
incomplete multipart upload, or a `_uploads/` staging object of versions before 1.6) is listed by
`unfinished_uploads` and removed with `abort_upload` by the recovery sweep (workers.recovery).
"""
from __future__ import annotations

import sys
from typing import Iterator, Protocol

from storage.uploads import UnfinishedUpload


def store_unreachable(exc: BaseException) -> bool:
    """Is `exc` the object store failing, never the caller's fault: S3 unreachable (refused, a
    timeout, a dropped connection) or answering 5xx (`SlowDown`, `ServiceUnavailable`,
    `InternalError`)? `Runtime.run` answers such a request 503 + Retry-After. botocore is looked up,
    not imported: a process that never made an S3 client (the embedded store) cannot have its errors,
    and starts without loading it."""
    errors = sys.modules.get("botocore.exceptions")
    if errors is None:
        return False
    if isinstance(exc, (errors.ConnectionError, errors.HTTPClientError)):
        return True
    return isinstance(exc, errors.ClientError) and exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) >= 500


class ObjectStore(Protocol):
    def put_file(self, key: str, path: str) -> None:
        """Store the file at `path` under `key`, all or nothing (replaces an existing object)."""

    def presigned_url(self, key: str, ttl: int) -> str:
        """A URL anyone holding it can GET the object with, for `ttl` seconds."""

    def exists(self, key: str) -> bool:
        """True when a complete object is stored under `key`."""

    def open_object(self, key: str):
        """(a binary stream of the object with `read(n)` and `close()`, its size in bytes);
        FileNotFoundError when no complete object is stored under `key` (a Bulk Data file's download)."""

    def list_keys(self, prefix: str) -> Iterator[str]:
        """The keys of the complete objects under `prefix` (a Bulk Data export's files, to delete them all)."""

    def delete(self, key: str) -> None:
        """Remove the object (no error when it is absent)."""

    def unfinished_uploads(self, prefix: str) -> Iterator[UnfinishedUpload]:
        """Uploads under `prefix` that were started and not completed (live ones included)."""

    def abort_upload(self, upload: UnfinishedUpload) -> None:
        """Discard an unfinished upload (no error when it is already gone)."""


REQUEST_ATTEMPTS = 2  # a call made while an HTTP request waits: one retry, then 503 + Retry-After
BATCH_ATTEMPTS = 5    # a worker's call (a chart ZIP's or a Bulk Data file's upload): Dramatiq retries the task too


def open_object_store(settings, hasher, clock, batch: bool = False) -> ObjectStore:
    """The store the configuration names: S3 when a bucket is configured, else the local one.

    S3 calls are bounded: made while an HTTP request waits, SVC_S3_TIMEOUT seconds to connect and
    per read, tried twice; a worker's (`batch`), SVC_S3_BATCH_TIMEOUT, tried five times."""
    if settings.s3_bucket:
        from storage.s3 import S3ObjectStore
        timeout, attempts = ((settings.s3_batch_timeout, BATCH_ATTEMPTS) if batch
                             else (settings.s3_timeout, REQUEST_ATTEMPTS))
        return S3ObjectStore(settings.s3_bucket, settings.s3_endpoint_url or None,
                             multipart_bytes=settings.s3_multipart_bytes, timeout=timeout, attempts=attempts)
    from storage.local import LocalObjectStore
    return LocalObjectStore(settings.objects_dir, settings.public_url, hasher, clock)
