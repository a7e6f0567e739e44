"""The nightly appointment snapshot (spec: "Behaviour of appointments").

For each organization where an application is installed, the snapshot of a night holds the
appointments of the next 10 days (from the start of the sync window) of every provider who
- is a physician (has an NPI),
- completed the auth flow of at least one application installed in the organization, and
- had an active connector session during that night's sync window.

Rows are written into a `building` snapshot; `publish` then flips it to `complete` and removes the
other snapshots of the same night in one transaction, so readers (`Snapshot.latest_complete`) see
yesterday's snapshot until the instant today's is whole. Re-running a night replaces it.
"""
from __future__ import annotations

import datetime as dt
import logging

import peewee

from connectors import ConnectorError, ConnectorUnavailable, Provider, connector_for
from connectors.sessions import active_during
from models.application import Authorization, Installation
from models.appointments import ConnectorSession, Snapshot, SnapshotAppointment
from models.directory import Organization, User
from models.prepared import PreparedInsert
from workers.leases import lease_seconds, record_sync_failure, snapshot_lease_keeper
from workers.tasks import task

log = logging.getLogger("svc_auth.snapshot")

COVERAGE = dt.timedelta(days=10)
INSERT_CHUNK = 500  # rows per INSERT: well under SQLite's bound-variable limit
_INSERT_APPOINTMENT = PreparedInsert(SnapshotAppointment)  # SQL text built once, rows sent in bulk
KEEP_NIGHTS = 2     # complete snapshots of older nights are pruned beyond this many
NIGHTLY_JOB = "nightly-sync"  # the scheduler's claim of a night (models.schedule.ScheduledRun)


def night_window(settings, night: dt.date) -> tuple[dt.datetime, dt.datetime]:
    """The UTC sync window of `night` (a window past midnight ends the next day)."""
    (sh, sm), (eh, em) = settings.sync_window_bounds
    start = dt.datetime.combine(night, dt.time(sh, sm))
    end = dt.datetime.combine(night, dt.time(eh, em))
    if end <= start:
        end += dt.timedelta(days=1)
    return start, end


def coming_night(settings, now: dt.datetime) -> dt.date:
    """The night whose sync window is open at `now`, else the next one to open (`snapshot run`'s default)."""
    for night in (now.date() - dt.timedelta(days=1), now.date()):
        if now < night_window(settings, night)[1]:
            return night
    return now.date() + dt.timedelta(days=1)


def eligible_providers(settings, organization_id: str, night: dt.date) -> list[User]:
    """The organization's users whose appointments this night's snapshot includes (rules above)."""
    window_start, window_end = night_window(settings, night)
    installed = Installation.select(Installation.application).where(Installation.organization == organization_id)
    authorized = Authorization.select(Authorization.user).where(Authorization.application.in_(installed))
    in_session = (ConnectorSession.select(ConnectorSession.user)
                  .where(active_during(window_start, window_end, settings.connector_session_ttl)))
    return list(User.select().where(
        (User.organization == organization_id) & User.npi.is_null(False) & (User.npi != "")
        & User.id.in_(authorized) & User.id.in_(in_session)).order_by(User.id))


def _rows(snapshot_id: int, user: User, appointments):
    for a in appointments:
        yield {"snapshot": snapshot_id, "ehr_appointment_id": a.id, "provider": user.id, "provider_npi": user.npi,
               "provider_name": user.display_name, "start": a.start, "end": a.end, "status": a.status,
               "appointment_type": a.appointment_type, "reason": a.reason[:500], "location": a.location[:200],
               "patient_id": a.patient.id, "patient_first_name": a.patient.first_name,
               "patient_last_name": a.patient.last_name, "patient_date_of_birth": a.patient.date_of_birth,
               "patient_sex": a.patient.sex}


def build_snapshot(runtime, organization_id: str, night: dt.date) -> Snapshot:
    """Fetch and store `night`'s snapshot of one organization, then publish it atomically.

    The `building` snapshot carries a lease renewed while it is written: if this process dies,
    the recovery sweep (workers.recovery) removes it and queues the night again."""
    settings, db, clock = runtime.settings, runtime.db, runtime.clock
    organization = Organization.get_by_id(organization_id)
    connector = connector_for(organization)
    window_start, _ = night_window(settings, night)
    providers = eligible_providers(settings, organization_id, night)
    now = clock.now()
    snapshot = Snapshot.create(organization=organization_id, snapshot_date=night, status="building", started_at=now,
                               lease_until=now + dt.timedelta(seconds=lease_seconds(settings)))
    try:
        count = 0
        with snapshot_lease_keeper(runtime, snapshot.id):
            for user in providers:
                provider = Provider(user_id=user.id, npi=user.npi, name=user.display_name,
                                    ehr_username=user.ehr_username)
                rows = _rows(snapshot.id, user,
                             connector.fetch_appointments(provider, window_start, window_start + COVERAGE))
                for chunk in peewee.chunked(rows, INSERT_CHUNK):
                    with db.atomic():
                        count += _INSERT_APPOINTMENT.insert_many(chunk)
    except BaseException:
        _discard(db, snapshot.id)
        raise
    publish(runtime, snapshot)
    log.info("snapshot of %s for %s: %d appointments of %d providers", organization_id, night, count, len(providers))
    return snapshot


def publish(runtime, snapshot: Snapshot) -> None:
    """Make `snapshot` the one of its night, in one transaction (readers switch atomically)."""
    org, night = snapshot.organization_id, snapshot.snapshot_date
    with runtime.db.atomic():
        replaced = [s.id for s in Snapshot.select(Snapshot.id).where(
            (Snapshot.organization == org) & (Snapshot.id != snapshot.id)
            & ((Snapshot.snapshot_date == night) | (Snapshot.snapshot_date < night - dt.timedelta(days=KEEP_NIGHTS - 1))))]
        if replaced:
            SnapshotAppointment.delete().where(SnapshotAppointment.snapshot.in_(replaced)).execute()
            Snapshot.delete().where(Snapshot.id.in_(replaced)).execute()
        updated = (Snapshot.update(status="complete", completed_at=runtime.clock.now())
                   .where((Snapshot.id == snapshot.id) & (Snapshot.status == "building")).execute())
        if not updated:  # a concurrent run of the same night published first and removed ours
            raise ConnectorUnavailable(f"snapshot {snapshot.id} was replaced while it was built; retrying")
    snapshot.status = "complete"


def _discard(db, snapshot_id: int) -> None:
    try:
        with db.atomic():
            SnapshotAppointment.delete().where(SnapshotAppointment.snapshot == snapshot_id).execute()
            Snapshot.delete().where(Snapshot.id == snapshot_id).execute()
    except peewee.PeeweeException:
        log.exception("could not remove unfinished snapshot %s", snapshot_id)


def organizations_to_sync() -> list[str]:
    """Organizations where at least one application is installed (data is limited to those)."""
    return [row.organization_id for row in
            Installation.select(Installation.organization).distinct().order_by(Installation.organization)]


def run_night(runtime, night: dt.date, organization_ids: list[str] | None = None) -> dict:
    """Build `night`'s snapshots now, in this process (`svc-auth snapshot run`)."""
    results = {}
    for org_id in organization_ids or organizations_to_sync():
        try:
            snapshot = build_snapshot(runtime, org_id, night)
            results[org_id] = SnapshotAppointment.select().where(SnapshotAppointment.snapshot == snapshot.id).count()
        except ConnectorError as exc:
            results[org_id] = f"failed: {exc}"
    return results


def enqueue_night(runtime, night: dt.date):
    """Queue the fan-out task of `night` (the scheduler calls this once per night)."""
    return runtime.task_queue.send(sync_night, night.isoformat())


# -- tasks ------------------------------------------------------------------------------------

def fan_out_night(runtime, night: str) -> int:
    """Queue one `sync_organization` task per organization; returns how many."""
    organizations = organizations_to_sync()
    for org_id in organizations:
        runtime.task_queue.send(sync_organization, org_id, night)
    log.info("nightly sync %s: queued %d organizations", night, len(organizations))
    return len(organizations)


@task(queue_name="snapshots")
def sync_night(runtime, night: str) -> None:
    """Fan out: one task per organization, so more workers finish the night sooner."""
    fan_out_night(runtime, night)


@task(queue_name="snapshots")
def sync_organization(runtime, organization_id: str, night: str) -> None:
    """One organization's snapshot; connector outages raise and are retried with backoff."""
    try:
        build_snapshot(runtime, organization_id, dt.date.fromisoformat(night))
    except ConnectorUnavailable:
        raise  # retried; yesterday's snapshot keeps being served meanwhile
    except (ConnectorError, Organization.DoesNotExist) as exc:
        log.error("snapshot of %s for %s failed for good: %s", organization_id, night, exc)
        record_sync_failure(organization_id, dt.date.fromisoformat(night))
