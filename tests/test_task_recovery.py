"""Every accepted chart request ends, exactly once, and every started snapshot completes or is
replaced, even when a real `svc-auth worker` is killed with SIGKILL mid-build (Redis broker, S3 on
a moto server). SVC_TASK_RECOVERY_SECONDS is short here so the bound is tested in seconds."""
from __future__ import annotations

import datetime as dt
import time

import pytest

import workers.charts as charts
from connectors.sandbox import patient_panel
from workers.activity import record_activity
from lifecycle.verification import record_platform_verification
from models.appointments import Snapshot, SnapshotAppointment
from models.charts import ChartRequest, new_request_id
from workers.recovery import sweep_charts
from workers.snapshot import coming_night, eligible_providers, sync_organization

from helpers.processes import wait_until
from helpers.s3 import bucket_keys, set_ehr_url

RECOVERY_SECONDS = 6
pytestmark = [pytest.mark.slow, pytest.mark.svc_settings(workers=True, task_recovery_seconds=RECOVERY_SECONDS)]
REQUESTS = 24


def statuses(ids) -> dict[str, str]:
    return {r.id: r.status for r in ChartRequest.select().where(ChartRequest.id.in_(ids))}


def worker_lines(tmp_path, request_ids) -> str:
    """What the workers logged about these requests: why an object is missing, if one is."""
    lines = [f"{log.name}: {line}" for log in sorted(tmp_path.glob("worker*.log"))
             for line in log.read_text(errors="replace").splitlines() if any(i in line for i in request_ids)]
    return f"missing objects of {sorted(request_ids)}; the workers' lines about them:\n" + "\n".join(lines[-60:])


def test_a_worker_killed_mid_build_loses_no_chart_request_and_makes_one_object_each(runtime, world, start_worker,
                                                                                     tmp_path):
    set_ehr_url(world.org, "https://ehr.example/test?latency=0.5")  # each build takes a while
    victim = start_worker()
    panel = patient_panel(world.org.id)
    ids = []
    for index in range(REQUESTS):
        request = ChartRequest.create(application=world.app.id, organization=world.org.id,
                                      patient_id=panel[index].id)
        charts.enqueue_chart_build(runtime, request.id)
        ids.append(request.id)
    # Kill it while some are done, some are being built and some were fetched but not started.
    def mid_build():
        requests = list(ChartRequest.select().where(ChartRequest.id.in_(ids)))
        return (sum(r.status == "ready" for r in requests) >= 3
                and any(r.status == "pending" and r.attempts > 0 for r in requests))
    wait_until(mid_build, 60, "the first charts, and more being built")
    victim.kill()
    victim.wait()
    killed_at = time.time()
    left = [i for i, s in statuses(ids).items() if s == "pending"]
    assert len(left) > 2, "the kill found work in progress and work not started"

    start_worker()
    # Re-queued within the bound, then built (0.5 s each, 2 threads): every request ends.
    wait_until(lambda: set(statuses(ids).values()) <= {"ready", "failed"}, RECOVERY_SECONDS + len(left) + 15,
               "every request to end")
    assert time.time() - killed_at < RECOVERY_SECONDS + len(left) + 15
    assert set(statuses(ids).values()) == {"ready"}
    assert bucket_keys(runtime.settings) == sorted(f"charts/{i}.zip" for i in ids), \
        worker_lines(tmp_path, set(ids) - {k[len("charts/"):-len(".zip")] for k in bucket_keys(runtime.settings)})
    time.sleep(1)  # duplicate deliveries (if any) change nothing
    assert bucket_keys(runtime.settings) == sorted(f"charts/{i}.zip" for i in ids)
    assert set(statuses(ids).values()) == {"ready"}


def test_a_request_whose_workers_keep_dying_fails_once_its_tries_are_used_up(runtime, world):
    request = ChartRequest.create(application=world.app.id, organization=world.org.id,
                                  patient_id=patient_panel(world.org.id)[0].id,
                                  attempts=runtime.settings.task_max_retries + 1,
                                  lease_owner="dead-worker", lease_until=runtime.clock.now() - dt.timedelta(seconds=1))
    assert sweep_charts(runtime) == []
    done = ChartRequest.get_by_id(request.id)
    assert done.status == "failed" and "its worker stopped" in done.error


def test_a_snapshot_whose_worker_is_killed_is_replaced_by_a_complete_one(runtime, world, start_worker):
    org = world.org
    record_platform_verification(runtime, world.app, world.physician)
    record_activity(runtime, world.physician)
    # The night whose window is open now or opens next: the session is active in it at any time of
    # day (the night after it would not be, before 02:00 UTC: CI went red that way once).
    night = coming_night(runtime.settings, runtime.clock.now())
    assert eligible_providers(runtime.settings, org.id, night), "the build has a physician to read, so it takes 4 s"
    set_ehr_url(org, "https://ehr.example/test?latency=4")  # the snapshot takes 4 s to read
    victim = start_worker()
    runtime.task_queue.send(sync_organization, org.id, night.isoformat())
    wait_until(lambda: Snapshot.select().where(Snapshot.organization == org.id).exists(), 30, "the build to start")
    victim.kill()
    victim.wait()
    assert [s.status for s in Snapshot.select().where(Snapshot.organization == org.id)] == ["building"]

    set_ehr_url(org, "https://ehr.example/test")
    start_worker()
    done = wait_until(lambda: Snapshot.latest_complete(org.id), RECOVERY_SECONDS + 15, "a complete snapshot")
    assert done.snapshot_date == night
    snapshots = list(Snapshot.select().where(Snapshot.organization == org.id))
    assert [(s.id, s.status) for s in snapshots] == [(done.id, "complete")]  # the half-built one is gone
    assert SnapshotAppointment.select().where(SnapshotAppointment.snapshot != done.id).count() == 0
    assert SnapshotAppointment.select().where(SnapshotAppointment.snapshot == done.id).count() > 0


def test_an_archive_left_by_a_store_outage_when_its_request_failed_is_deleted_once_the_store_is_back(
        runtime, world, tmp_path):
    """A build that uploaded its ZIP and then died leaves the object; when the request fails (its
    tries used up) `mark_failed` deletes it. With the object store down at that moment the delete
    failed, was logged, and nothing ever tried again: the patient's chart stayed in the store for
    good. A real worker's sweep now deletes it once the store answers again (the worker reaches
    moto's server through a proxy that goes down and comes back, moto keeping the object)."""
    import boto3
    from helpers.processes import start_process, stop_process
    from helpers.s3 import OutageProxy, worker_env
    settings = runtime.settings
    request_id = new_request_id()
    boto3.client("s3", endpoint_url=settings.s3_endpoint_url, region_name="us-east-1").put_object(
        Bucket=settings.s3_bucket, Key=charts.chart_key(request_id), Body=b"PK a killed build's ZIP")
    assert bucket_keys(settings) == [charts.chart_key(request_id)]
    proxy = OutageProxy(int(settings.s3_endpoint_url.rsplit(":", 1)[1]))
    log = tmp_path / "worker.log"
    worker = start_process(["worker", "--threads", "1"], {**worker_env(settings.replace(s3_endpoint_url=proxy.url)),
                                                          "SVC_S3_BATCH_TIMEOUT": "1"}, log_path=log)
    try:
        wait_until(lambda: "worker consuming" in log.read_text(), 60, "the worker")
        proxy.down()                       # the store stops answering
        # The request whose build stored that ZIP: its tries used up, its worker gone. The sweep fails it.
        request = ChartRequest.create(id=request_id, application=world.app.id, organization=world.org.id,
                                      patient_id=patient_panel(world.org.id)[0].id,
                                      attempts=settings.task_max_retries + 1, lease_owner="dead-worker",
                                      lease_until=runtime.clock.now() - dt.timedelta(seconds=1))
        wait_until(lambda: ChartRequest.get_by_id(request.id).status == "failed", 60, "the request failed")
        wait_until(lambda: "could not be deleted" in log.read_text(), 60, "the delete refused by the store")
        assert bucket_keys(settings) == [charts.chart_key(request.id)]   # still there
        proxy.up()                         # the store is back
        wait_until(lambda: bucket_keys(settings) == [], RECOVERY_SECONDS + 30, "the ZIP deleted by the sweep")
        wait_until(lambda: ChartRequest.get_by_id(request.id).object_key is None, 30, "the request to forget it")
        assert ChartRequest.get_by_id(request.id).status == "failed"
    finally:
        stop_process(worker)
        proxy.close()
