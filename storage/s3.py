"""S3-compatible object store through boto3 (AWS S3, MinIO, moto...).

Credentials and region come from the standard `AWS_*` environment variables / config files that
boto3 reads; `SVC_S3_ENDPOINT_URL` points it at a non-AWS server.

An object up to `multipart_bytes` is one `PutObject` to its final key, with its MD5 so the server
refuses a damaged body: S3 stores it whole or not at all, so a killed writer leaves nothing. A
larger one is a multipart upload, invisible until completed; a writer killed inside it leaves an
incomplete upload, which the recovery sweep aborts (and the bucket lifecycle rule
`AbortIncompleteMultipartUpload` is the backstop, docs/operations.md).
"""
from __future__ import annotations

import base64
import datetime as dt
import hashlib
import logging
import threading
from typing import Iterator

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from storage.uploads import UnfinishedUpload
from storage.keys import check_key

log = logging.getLogger("svc_auth.storage")

LEGACY_STAGING_PREFIX = "_uploads/"  # where versions before 1.6 staged uploads before copying them
MIN_PART_BYTES = 8 * 1024 * 1024     # S3's minimum is 5 MiB for every part but the last
MAX_PARTS = 10_000


def _md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()


def _naive_utc(moment: dt.datetime) -> dt.datetime:
    return moment.astimezone(dt.timezone.utc).replace(tzinfo=None) if moment.tzinfo else moment


class S3ObjectStore:
    def __init__(self, bucket: str, endpoint_url: str | None = None, multipart_bytes: int = 64 * 1024 * 1024,
                 timeout: float = 60, attempts: int = 5):
        """`timeout`: seconds to connect, and to wait for each read of an answer; `attempts`: tries
        of one call in all (botocore's standard retries), so a silent S3 costs at most about
        `timeout * attempts` seconds per call (storage.open_object_store chooses them)."""
        self.bucket = bucket
        self.multipart_bytes = multipart_bytes
        session = boto3.session.Session()
        self.client = session.client(
            "s3", endpoint_url=endpoint_url, region_name=session.region_name or "us-east-1",
            config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                          connect_timeout=timeout, read_timeout=timeout,
                          retries={"total_max_attempts": attempts, "mode": "standard"}))
        self._bucket_checked = False
        self._lock = threading.Lock()

    def _ensure_bucket(self) -> None:
        """Create the bucket on first use when it does not exist (handy with MinIO in development)."""
        if self._bucket_checked:
            return
        with self._lock:
            try:
                self.client.head_bucket(Bucket=self.bucket)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket", "NotFound"):
                    raise
                self.client.create_bucket(Bucket=self.bucket)
            self._bucket_checked = True

    def put_file(self, key: str, path: str) -> None:
        check_key(key)
        self._ensure_bucket()
        with open(path, "rb") as source:
            source.seek(0, 2)
            size = source.tell()
            source.seek(0)
            if size <= self.multipart_bytes:
                body = source.read()
                self.client.put_object(Bucket=self.bucket, Key=key, Body=body, ContentMD5=_md5(body))
            else:
                self._put_multipart(key, source, size)

    def _put_multipart(self, key: str, source, size: int) -> None:
        part_bytes = max(MIN_PART_BYTES, -(-size // MAX_PARTS))
        upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
        try:
            parts = []
            while chunk := source.read(part_bytes):
                number = len(parts) + 1
                etag = self.client.upload_part(Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number,
                                               Body=chunk, ContentMD5=_md5(chunk))["ETag"]
                parts.append({"ETag": etag, "PartNumber": number})
            self.client.complete_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id,
                                                  MultipartUpload={"Parts": parts})
        except BaseException:
            self.abort_upload(UnfinishedUpload(key, dt.datetime.utcnow(), ("multipart", key, upload_id)))
            raise

    def unfinished_uploads(self, prefix: str) -> Iterator[UnfinishedUpload]:
        check_key(prefix.rstrip("/"))
        self._ensure_bucket()
        for page in self.client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket, Prefix=prefix):
            for upload in page.get("Uploads", []):
                yield UnfinishedUpload(upload["Key"], _naive_utc(upload["Initiated"]),
                                       ("multipart", upload["Key"], upload["UploadId"]))
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                           Prefix=LEGACY_STAGING_PREFIX):
            for obj in page.get("Contents", []):
                yield UnfinishedUpload(None, _naive_utc(obj["LastModified"]), ("object", obj["Key"]))

    def abort_upload(self, upload: UnfinishedUpload) -> None:
        try:
            if upload.handle[0] == "multipart":
                _, key, upload_id = upload.handle
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            else:
                self.client.delete_object(Bucket=self.bucket, Key=upload.handle[1])
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchUpload", "NoSuchKey", "NotFound"):
                raise

    def exists(self, key: str) -> bool:
        check_key(key)
        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    def list_keys(self, prefix: str) -> Iterator[str]:
        check_key(prefix.rstrip("/"))
        self._ensure_bucket()
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                yield obj["Key"]

    def open_object(self, key: str):
        """(a binary stream of the object, its size); FileNotFoundError when it is absent."""
        check_key(key)
        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                raise FileNotFoundError(key) from None
            raise
        return answer["Body"], answer["ContentLength"]

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=check_key(key))

    def presigned_url(self, key: str, ttl: int) -> str:
        return self.client.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": check_key(key)}, ExpiresIn=int(ttl))
