"""Builders of the same night cooperate (issue 18): two concurrent `svc-auth snapshot run` for the
night after a third was killed with SIGKILL mid-build both exit 0, and the night ends with one
complete snapshot per organization and no duplicate rows; a task finding a live builder leaves
the night to it; a builder paused past its lease changes nothing of the builder that took its night
over. Real `svc-auth` processes against the real database (SQLite and PostgreSQL)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from connectors import ConnectorUnavailable
from schedules import EhrPull
from workers.activity import record_activity
from lifecycle.applications import install_application
from lifecycle.organizations import create_organization
from lifecycle.users import create_user
from lifecycle.verification import record_platform_verification
from models.appointments import Snapshot, SnapshotAppointment
from models.schedule import ScheduledRun
from workers.leases import lease_seconds, snapshot_lease_keeper
from workers.snapshot import BuildInProgress, build_snapshot, claim_build, coming_night, eligible_providers, sync_organization

from helpers.environment import ROOT
from helpers.processes import settings_env, wait_until

RECOVERY_SECONDS = 6  # a killed builder's lease lapses after 3 s
CLINICS = 4


def clinics(runtime, world) -> list[str]:
    """`CLINICS` organizations, each with an authorized physician in session tonight, slow to read."""
    orgs = [world.org]
    for n in range(1, CLINICS):
        org = create_organization(f"Clinic {n}", "sandbox", "https://ehr.example/test")
        create_user(org.id, f"doc{n}@example.com", "Doc", f"Number{n}", f"doc{n}", "1234567893")
        install_application(world.app.id, org.id)
        orgs.append(org)
    from models.directory import Organization, User
    for org in orgs:
        Organization.update(ehr_url="https://ehr.example/test?latency=0.7").where(Organization.id == org.id).execute()
        for user in User.select().where((User.organization == org.id) & User.npi.is_null(False)):
            record_platform_verification(runtime, world.app, user)
            record_activity(runtime, user)
    return sorted(org.id for org in orgs)


def snapshot_run(settings, night, **popen):
    env = settings_env(settings, SVC_TASK_RECOVERY_SECONDS=RECOVERY_SECONDS)
    return subprocess.Popen([sys.executable, "-m", "cli.__main__", "snapshot", "run", "--date", night.isoformat(),
                             "--json"], env=env, cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)


def test_two_runs_of_a_night_after_a_killed_one_both_succeed_with_one_snapshot_each(runtime, world, settings):
    orgs = clinics(runtime, world)
    night = coming_night(runtime.settings, runtime.clock.now())
    assert all(eligible_providers(runtime.settings, org, night) for org in orgs), "every build reads for a while"

    victim = snapshot_run(settings, night)
    building = wait_until(lambda: Snapshot.get_or_none(Snapshot.status == "building"), 30, "the first build to start")
    victim.kill()
    victim.wait()
    # The kill landed mid-build: its snapshot is still building, with its lease not yet lapsed.
    assert Snapshot.get_by_id(building.id).status == "building"

    runs = [snapshot_run(settings, night) for _ in range(2)]
    outputs = [run.communicate(timeout=120) for run in runs]
    reports = [json.loads(out) for out, _ in outputs]
    for run, (out, err) in zip(runs, outputs):
        assert run.returncode == 0, (out, err)
    for report in reports:
        assert sorted(report["organizations"]) == orgs
        assert all(isinstance(count, int) and count > 0 for count in report["organizations"].values()), report
        assert sorted(report["built"] + report["found_built"]) == orgs
    # The killed run's organization was taken over by one run and found built by the other.
    assert any(building.organization_id in r["found_built"] for r in reports), reports

    snapshots = list(Snapshot.select().where(Snapshot.snapshot_date == night))
    assert sorted(s.organization_id for s in snapshots) == orgs and {s.status for s in snapshots} == {"complete"}
    assert SnapshotAppointment.select().where(SnapshotAppointment.snapshot.not_in([s.id for s in snapshots])).count() == 0
    for snapshot in snapshots:
        rows = SnapshotAppointment.select(SnapshotAppointment.ehr_appointment_id).where(
            SnapshotAppointment.snapshot == snapshot.id)
        ids = [r.ehr_appointment_id for r in rows]
        assert ids and len(ids) == len(set(ids)), "no duplicate rows"


def test_a_task_that_finds_a_live_builder_leaves_the_night_to_it(runtime, world):
    org = world.org.id
    night = coming_night(runtime.settings, runtime.clock.now())
    ours = claim_build(runtime, org, night)  # another builder (a `snapshot run`) holds the night
    assert ours is not None and claim_build(runtime, org, night) is None
    sync_organization(runtime, org, night.isoformat())  # the scheduler's task, run directly
    assert [(s.id, s.status) for s in Snapshot.select().where(Snapshot.organization == org)] == [(ours.id, "building")]
    assert not ScheduledRun.select().where(ScheduledRun.job.startswith("sync-failed")).exists()  # not a failure


def _building(org, night) -> list[tuple]:
    """The night's snapshots as (id, status, lease_until, appointment rows)."""
    return [(s.id, s.status, s.lease_until,
             SnapshotAppointment.select().where(SnapshotAppointment.snapshot == s.id).count())
            for s in Snapshot.select().where((Snapshot.organization == org) & (Snapshot.snapshot_date == night))]


@pytest.mark.parametrize("then, stops_with", [("answers", BuildInProgress), ("fails", ConnectorUnavailable)])
def test_a_builder_paused_past_its_lease_changes_nothing_of_the_builder_that_took_its_night_over(
        runtime, world, backend, monkeypatch, then, stops_with):
    """While the first builder waits on the EHR (a pause longer than its lease: a stopped process, a
    stalled VM), its lease lapses and a second builder claims the night, on SQLite under the same
    snapshot id (SQLite reuses a deleted newest row's id). Whether the EHR then answers (the first
    writes its rows and publishes) or fails (it discards its snapshot), the second's is untouched."""
    org = world.org.id
    record_platform_verification(runtime, world.app, world.physician)
    record_activity(runtime, world.physician)
    night = coming_night(runtime.settings, runtime.clock.now())
    first, second = [], []
    read = EhrPull.fetch_appointments

    def paused_past_the_lease(source, provider, start, end):
        first.append(Snapshot.get((Snapshot.organization == org) & (Snapshot.status == "building")))
        runtime.clock.advance(lease_seconds(runtime.settings) + 1)
        second.append(claim_build(runtime, org, night))
        if then == "fails":
            raise ConnectorUnavailable("the EHR went down meanwhile")
        return read(source, provider, start, end)
    monkeypatch.setattr(EhrPull, "fetch_appointments", paused_past_the_lease)

    with pytest.raises(stops_with):
        build_snapshot(runtime, org, night)
    assert second[0] is not None, "the second builder took the lapsed night over"
    if backend == "sqlite":
        assert second[0].id == first[0].id  # the reuse that let the first find the second's row
    assert _building(org, night) == [(second[0].id, "building", second[0].lease_until, 0)]


@pytest.mark.svc_settings(task_recovery_seconds=3)  # a lease of 1.5 s, renewed every 0.5 s
def test_a_lease_keeper_whose_build_lost_its_lease_renews_nothing_and_tells_the_build(runtime, world, backend):
    org = world.org.id
    night = coming_night(runtime.settings, runtime.clock.now())
    first = claim_build(runtime, org, night)
    runtime.clock.advance(lease_seconds(runtime.settings) + 1)  # the first builder paused past its lease
    second = claim_build(runtime, org, night)
    assert second is not None
    if backend == "sqlite":
        assert second.id == first.id
    runtime.clock.advance(1)  # a renewal now would move the lease on
    keeper = snapshot_lease_keeper(runtime, first)
    keeper.renew()  # what the keeper's thread does every third of the lease
    assert _building(org, night) == [(second.id, "building", second.lease_until, 0)]
    with keeper:
        assert keeper.lost.wait(10), "the keeper's first renewal tells its build to stop"
    assert _building(org, night) == [(second.id, "building", second.lease_until, 0)]
