"""Workers for real: `svc-auth worker` / `svc-auth scheduler` processes on the shared Redis (own
namespace per test), the database of the test, and an S3-compatible server (moto) on loopback."""
from __future__ import annotations

import datetime as dt
import time
import urllib.request

import pytest
import redis

import workers.charts as charts
from connectors.sandbox import patient_panel
from workers.activity import record_activity
from lifecycle.applications import install_application
from lifecycle.organizations import create_organization
from lifecycle.users import create_user
from lifecycle.verification import record_platform_verification
from models.appointments import Snapshot
from models.charts import ChartRequest
from models.schedule import ScheduledRun
from workers.retention import JOB as RETENTION_JOB
from workers.scheduler import night_due
from workers.snapshot import fan_out_night

from helpers.charts import open_archive
from helpers.environment import REDIS_URL
from helpers.processes import settings_env, start_process, stop_process, wait_until
from helpers.s3 import bucket_keys, set_ehr_url, worker_env

# Redis (a namespace of the test's own), S3 and fast retries.
pytestmark = [pytest.mark.slow, pytest.mark.svc_settings(workers=True, task_max_retries=2, task_min_backoff_ms=100,
                                                         task_max_backoff_ms=300, task_recovery_seconds=6)]


@pytest.fixture
def child_env(settings):
    return worker_env(settings)


def request_for(world, patient_index=0) -> ChartRequest:
    patient = patient_panel(world.org.id)[patient_index]
    return ChartRequest.create(application=world.app.id, organization=world.org.id, patient_id=patient.id)


def status_of(request_id) -> ChartRequest:
    return ChartRequest.get_by_id(request_id)


def test_chart_zip_built_by_a_worker_process_into_s3_and_fetched_over_a_presigned_url(runtime, world, start_worker):
    assert not runtime.task_queue.embedded
    start_worker()
    request = request_for(world, 11)
    charts.enqueue_chart_build(runtime, request.id)
    done = wait_until(lambda: status_of(request.id).status != "pending" and status_of(request.id), what="chart build")
    assert (done.status, done.error) == ("ready", None)
    assert bucket_keys(runtime.settings) == [f"charts/{request.id}.zip"]  # no temporary upload left behind

    url = runtime.object_store.presigned_url(done.object_key, 900)
    assert url.startswith(runtime.settings.s3_endpoint_url) and "Signature" in url
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        body = response.read()
    patient = patient_panel(world.org.id)[11]
    text, data = open_archive(body, request.id, world.app.id)
    assert f"{patient.first_name} {patient.last_name}" in text
    assert data["patient"]["date_of_birth"] == patient.date_of_birth.isoformat()


def test_test_mode_zip_in_s3(runtime):
    key = charts.test_mode_object(runtime)
    with urllib.request.urlopen(runtime.object_store.presigned_url(key, 60), timeout=10) as response:
        text, data = open_archive(response.read(), charts.TEST_REQUEST_ID, runtime.settings.demo_application_id)
    assert data["request_id"] == charts.TEST_REQUEST_ID and "Patient chart" in text


def test_an_ehr_outage_is_retried_with_backoff_until_it_is_over(runtime, world, start_worker):
    set_ehr_url(world.org, "https://ehr.example/test?outage=1")
    start_worker()
    request = request_for(world)
    charts.enqueue_chart_build(runtime, request.id)
    # `attempts` counts an attempt as it starts, before the connector reads the EHR address, so
    # only a second attempt proves the first one met the outage.
    wait_until(lambda: status_of(request.id).attempts >= 2, what="a retry after the outage")
    set_ehr_url(world.org, "https://ehr.example/test")
    done = wait_until(lambda: status_of(request.id).status != "pending" and status_of(request.id), what="retry")
    assert done.status == "ready" and done.attempts >= 2


def test_a_request_fails_with_a_reason_when_the_retries_run_out(runtime, world, start_worker):
    set_ehr_url(world.org, "https://ehr.example/test?outage=1")
    start_worker()
    request = request_for(world)
    charts.enqueue_chart_build(runtime, request.id)
    done = wait_until(lambda: status_of(request.id).status != "pending" and status_of(request.id), what="failure")
    assert done.status == "failed" and done.attempts == 3  # the first try and 2 retries
    assert done.error.startswith("The EHR did not answer after 3 attempts")
    assert bucket_keys(runtime.settings) == []


def test_a_worker_killed_mid_build_leaves_the_request_retryable_and_a_retry_makes_one_object(
        runtime, world, start_worker):
    set_ehr_url(world.org, "https://ehr.example/test?latency=30")
    victim = start_worker()
    request = request_for(world, 5)
    charts.enqueue_chart_build(runtime, request.id)
    wait_until(lambda: status_of(request.id).attempts == 1, what="the build to start")
    victim.kill()  # SIGKILL: no chance to clean up
    victim.wait()
    assert status_of(request.id).status == "pending"
    assert bucket_keys(runtime.settings) == []

    set_ehr_url(world.org, "https://ehr.example/test")
    start_worker()  # its recovery sweep re-queues the request once the dead worker's lease lapses
    charts.enqueue_chart_build(runtime, request.id)  # a duplicate delivery is harmless too
    done = wait_until(lambda: status_of(request.id).status != "pending" and status_of(request.id), what="the retry")
    assert done.status == "ready"
    time.sleep(0.5)  # let the duplicate run
    assert bucket_keys(runtime.settings) == [f"charts/{request.id}.zip"]
    assert status_of(request.id).ready_at == done.ready_at


def eligible_clinic(runtime, world, name: str):
    org = create_organization(name, "sandbox")
    doc = create_user(org.id, f"doc@{org.id}.example", "Doc", name, None, "1679576722")
    install_application(world.app.id, org.id)
    record_platform_verification(runtime, world.app, doc)
    record_activity(runtime, doc)
    return org


def test_the_nightly_sync_fans_out_one_task_per_organization(runtime, world, start_worker, clock):
    night = clock.now().date()
    record_platform_verification(runtime, world.app, world.physician)
    record_activity(runtime, world.physician)
    orgs = [world.org] + [eligible_clinic(runtime, world, f"Clinic {n}") for n in range(2)]
    assert fan_out_night(runtime, night.isoformat()) == 3  # what the sync_night task does
    client = redis.Redis.from_url(REDIS_URL)
    queue = f"{runtime.settings.redis_namespace}:tasks:snapshots"
    assert client.llen(queue) == 3 and client.hlen(queue + ".msgs") == 3
    start_worker()
    start_worker()
    snapshots = wait_until(lambda: [s for o in orgs if (s := Snapshot.latest_complete(o.id))] if all(
        Snapshot.latest_complete(o.id) for o in orgs) else None, what="three snapshots")
    assert {s.snapshot_date for s in snapshots} == {night}
    assert client.llen(queue) == 0
    client.close()


def test_several_schedulers_queue_the_night_once(runtime, world, child_env, tmp_path, start_worker, clock):
    now = clock.now()
    window = f"{(now - dt.timedelta(minutes=1)):%H:%M}-{(now + dt.timedelta(minutes=30)):%H:%M}"
    env = {**child_env, "SVC_SYNC_WINDOW": window}
    schedulers = [start_process(["scheduler", "--interval", "0.2"], env, log_path=tmp_path / f"scheduler{n}.log")
                  for n in range(3)]
    try:
        client = redis.Redis.from_url(REDIS_URL)
        queue = f"{runtime.settings.redis_namespace}:tasks:snapshots"
        wait_until(lambda: client.llen(queue) >= 1, what="the nightly sync to be queued")
        time.sleep(1.5)  # every scheduler ticks several more times meanwhile
        assert client.llen(queue) == 1
        night = night_due(runtime.settings.replace(sync_window=window), now)
        assert [(r.job, r.run_date) for r in ScheduledRun.select().where(ScheduledRun.job != RETENTION_JOB)] == [
            ("nightly-sync", night)]
        # one swept today: a round's retention comes after its sweep, which on a loaded machine may
        # still be running 1.5 s after the first tick queued the night
        wait_until(lambda: ScheduledRun.select().where(ScheduledRun.job == RETENTION_JOB).count() >= 1,
                   what="today's retention")
        assert ScheduledRun.select().where(ScheduledRun.job == RETENTION_JOB).count() == 1
        start_worker()
        wait_until(lambda: Snapshot.latest_complete(world.org.id), what="the night's snapshot")
        assert Snapshot.latest_complete(world.org.id).snapshot_date == night
        client.close()
    finally:
        for proc in schedulers:
            assert stop_process(proc) == 0


def test_worker_without_redis_explains_itself(settings, tmp_path):
    import subprocess
    import sys
    from helpers.environment import ROOT
    env = settings_env(settings.replace(redis_url=""))
    env.pop("SVC_REDIS_URL", None)
    result = subprocess.run([sys.executable, "-m", "cli.__main__", "worker"], env=env, cwd=str(ROOT),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "SVC_REDIS_URL is not set" in result.stderr
