"""S3-compatible object store through boto3 (AWS S3, MinIO, moto...).

Credentials and region come from the standard `AWS_*` environment variables / config files that
boto3 reads; `SVC_S3_ENDPOINT_URL` points it at a non-AWS server.
"""
from __future__ import annotations

import logging
import os
import threading
import uuid

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from storage.keys import check_key

log = logging.getLogger("svc_auth.storage")

TEMP_PREFIX = "_uploads/"


class S3ObjectStore:
    def __init__(self, bucket: str, endpoint_url: str | None = None):
        self.bucket = bucket
        session = boto3.session.Session()
        self.client = session.client(
            "s3", endpoint_url=endpoint_url, region_name=session.region_name or "us-east-1",
            config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                          retries={"max_attempts": 5, "mode": "standard"}))
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
        # Upload (streamed, multipart for big files) under a temporary key, check it, then copy it
        # into place: `key` only ever holds a complete object, and a retry simply overwrites it.
        temp = f"{TEMP_PREFIX}{uuid.uuid4().hex}"
        self.client.upload_file(path, self.bucket, temp)
        try:

            size = os.path.getsize(path)
            stored = self.client.head_object(Bucket=self.bucket, Key=temp)["ContentLength"]
            if stored != size:
                raise IOError(f"uploaded {stored} bytes of {size} for {key}")
            self.client.copy({"Bucket": self.bucket, "Key": temp}, self.bucket, key)
        finally:
            try:
                self.client.delete_object(Bucket=self.bucket, Key=temp)
            except ClientError:
                log.warning("could not delete temporary upload %s", temp)

    def exists(self, key: str) -> bool:
        check_key(key)
        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=check_key(key))

    def presigned_url(self, key: str, ttl: int) -> str:
        return self.client.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": check_key(key)}, ExpiresIn=int(ttl))
