"""A worker killed with SIGKILL exactly inside a chart upload leaves nothing behind (issue 18).

The worker talks to S3 (moto's server) through `HoldingProxy`, which holds its upload: the
`PutObject` of a small chart, or, with SVC_S3_MULTIPART_BYTES=1, a part of a multipart upload.
The test waits until the upload is held, kills the worker there, and then a new worker rebuilds
the chart. In the end the bucket holds `charts/<id>.zip` alone: no staging object, no incomplete
multipart upload (the sweep aborts it once its lease lapses), and an older version's `_uploads/`
staging object is removed too."""
from __future__ import annotations

import re
from urllib.parse import urlsplit

import boto3
import pytest

import workers.charts as charts
from connectors.sandbox import patient_panel
from models.charts import ChartRequest

from helpers.processes import settings_env, start_process, stop_process, wait_until
from helpers.s3 import AWS, HoldingProxy, bucket_keys

RECOVERY_SECONDS = 6
pytestmark = [pytest.mark.slow, pytest.mark.svc_settings(workers=True, task_recovery_seconds=RECOVERY_SECONDS)]


@pytest.fixture
def proxy(settings):
    holding = HoldingProxy(urlsplit(settings.s3_endpoint_url).port)
    yield holding
    holding.close()


def s3(settings):
    return boto3.client("s3", endpoint_url=settings.s3_endpoint_url, region_name="us-east-1")


def unfinished_multipart(settings) -> list[str]:
    return [u["Key"] for u in s3(settings).list_multipart_uploads(Bucket=settings.s3_bucket).get("Uploads", [])]


@pytest.mark.parametrize("multipart_bytes", [64 * 1024 * 1024, 1], ids=["put-object", "multipart"])
def test_a_worker_killed_inside_an_upload_leaves_one_object_and_nothing_else(runtime, world, settings, proxy,
                                                                            tmp_path, multipart_bytes):
    s3(settings).put_object(Bucket=settings.s3_bucket, Key="_uploads/0f1e2d3c", Body=b"left by svc-auth 1.5")
    env = settings_env(settings, SVC_TASK_RECOVERY_SECONDS=RECOVERY_SECONDS, SVC_S3_MULTIPART_BYTES=multipart_bytes,
                       **AWS)
    env["SVC_S3_ENDPOINT_URL"] = proxy.url
    request = ChartRequest.create(application=world.app.id, organization=world.org.id,
                                  patient_id=patient_panel(world.org.id)[0].id)
    key = charts.chart_key(request.id)
    proxy.arm(rb"PUT /" + settings.s3_bucket.encode() + rb"/" + re.escape(key.encode()))
    victim = start_process(["worker", "--threads", "1"], env, log_path=tmp_path / "victim.log")
    workers = [victim]
    try:
        charts.enqueue_chart_build(runtime, request.id)
        assert proxy.held.wait(60), "the worker never started the upload"
        victim.kill()
        victim.wait()
        # The kill landed inside the upload: the request is still pending, nothing is at its key,
        # and a multipart upload was started and not completed.
        assert ChartRequest.get_by_id(request.id).status == "pending"
        assert key not in bucket_keys(settings)
        assert unfinished_multipart(settings) == ([key] if multipart_bytes == 1 else [])
        proxy.disarm()

        workers.append(start_process(["worker", "--threads", "1"], env, log_path=tmp_path / "worker.log"))
        wait_until(lambda: ChartRequest.get_by_id(request.id).status != "pending", RECOVERY_SECONDS + 30,
                   "the request to be rebuilt")
        assert ChartRequest.get_by_id(request.id).status == "ready"
        wait_until(lambda: not unfinished_multipart(settings) and bucket_keys(settings) == [key],
                   RECOVERY_SECONDS + 15, f"the bucket to hold {key} alone")
    finally:
        for proc in workers:
            stop_process(proc)
