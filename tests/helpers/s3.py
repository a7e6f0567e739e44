"""moto's S3 server on loopback for the worker tests, and what a bucket holds."""
from __future__ import annotations

import uuid

import boto3
import pytest

from helpers import REDIS_URL, free_port, start_process, stop_process, wait_for_port
from models.directory import Organization


AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory):
    """moto's standalone S3-compatible server, a real HTTP server on a free loopback port."""
    import os
    port = free_port()
    env = {**os.environ, **AWS}
    proc = start_process(["-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], env,
                         log_path=tmp_path_factory.mktemp("moto") / "moto.log")
    wait_for_port(port, proc=proc)
    yield f"http://127.0.0.1:{port}"
    stop_process(proc)


def bucket_keys(settings) -> list[str]:
    s3 = boto3.client("s3", endpoint_url=settings.s3_endpoint_url, region_name="us-east-1")
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=settings.s3_bucket).get("Contents", []))


def set_ehr_url(org, url: str) -> None:
    Organization.update(ehr_url=url).where(Organization.id == org.id).execute()


def worker_settings(settings, s3_endpoint: str, monkeypatch, redis_namespace: str, **fields):
    """`settings` in the worker shape: Redis (a namespace of the test's own), a fresh bucket on
    moto's S3 server (credentials in the environment), and `fields` (retries, recovery...)."""
    for name, value in AWS.items():
        monkeypatch.setenv(name, value)
    configured = settings.replace(redis_url=REDIS_URL, redis_namespace=redis_namespace, s3_endpoint_url=s3_endpoint,
                                  s3_bucket=f"charts-{uuid.uuid4().hex[:10]}", **fields)
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=configured.s3_bucket)
    return configured
