"""Object store for chart ZIPs: one interface, two stores chosen by configuration alone.

- `LocalObjectStore` (embedded default): files under `var/objects/`; download URLs are
  HMAC-signed, expiring URLs served by the service itself (`handlers/objects.py`).
- `S3ObjectStore` (`SVC_S3_BUCKET`, optional `SVC_S3_ENDPOINT_URL`): boto3 against AWS S3, MinIO or
  any S3-compatible server; download URLs are presigned GET URLs.

Both only ever make an object visible complete: `put_file` writes under a temporary name and
renames/copies it into place, so a crash leaves no partial object at `key`.
"""
from __future__ import annotations

from typing import Protocol


class ObjectStore(Protocol):
    def put_file(self, key: str, path: str) -> None:
        """Store the file at `path` under `key`, all or nothing (replaces an existing object)."""

    def presigned_url(self, key: str, ttl: int) -> str:
        """A URL anyone holding it can GET the object with, for `ttl` seconds."""

    def exists(self, key: str) -> bool:
        """True when a complete object is stored under `key`."""

    def delete(self, key: str) -> None:
        """Remove the object (no error when it is absent)."""


def open_object_store(settings, hasher, clock) -> ObjectStore:
    """The store the configuration names: S3 when a bucket is configured, else the local one."""
    if settings.s3_bucket:
        from storage.s3 import S3ObjectStore
        return S3ObjectStore(settings.s3_bucket, settings.s3_endpoint_url or None)
    from storage.local import LocalObjectStore
    return LocalObjectStore(settings.objects_dir, settings.public_url, hasher, clock)
