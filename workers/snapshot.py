"""The nightly appointment snapshot (spec: "Behaviour of appointments").

For each organization where an application is installed, the snapshot of a night holds the
appointments of the next 10 days (from the start of the sync window) of every provider who
- is a physician (has an NPI),
- completed the auth flow of at least one application installed in the organization, and
- had an active connector session during that night's sync window.

Rows are written into a `building` snapshot; `publish` then flips it to `complete` and removes the
other snapshots of the same night in one transaction, so readers (`Snapshot.latest_complete`) see
yesterday's snapshot until the instant today's is whole. Re-running a night replaces it.

Builders cooperate: one `building` row per (organization, night) is allowed (a unique index), so
a second builder of the same night never destroys the first one's work. A task leaves the night
to the live builder; `snapshot run` waits for it and reports the night found built; a builder
whose lease lapsed (it died) is taken over. Each build holds its row by a token of its own
(`lease_owner`): a builder paused past its lease, whose row was swept or taken over, stops at its
next write, and its renewals, rows, publish and discard change nothing (`BuildTakenOver`).

One clinic's build has a deadline, `SVC_SNAPSHOT_BUILD_DEADLINE` (`BuildDeadline`): past it the build
stops at its next EHR request (`Bounds.snapshot`) or batch of rows, its `building` snapshot is
discarded (the previous complete one stays published) and that clinic's night fails naming it.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import re
import secrets
import time
from dataclasses import dataclass, field

import peewee

from audit.disclosures import ehr_recorder
from connectors import Bounds, ConnectorError, ConnectorUnavailable, DeadlineExceeded, Provider
from workers.activity import active_during
from models.application import Authorization, Installation
from models.appointments import ConnectorSession, Snapshot, SnapshotAppointment
from models.directory import Organization, User
from models.prepared import PreparedInsert
from schedules import schedule_source
from workers.leases import (extend_snapshot_lease, lease_seconds, record_sync_failure, snapshot_held,
                            snapshot_lease_keeper)
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


_TEXT_COLUMNS = tuple((name, SnapshotAppointment._meta.fields[name].max_length) for name in (
    "provider_name", "appointment_type", "reason", "location", "patient_first_name", "patient_last_name", "patient_sex"))
"""Free text a row holds, cut to its column: a user's name (given and family, up to 200 each) or
whatever an EHR writes (names, visit types) never fails the clinic's night (PostgreSQL refuses
text longer than a column; SQLite stored it whole). Ids are never cut."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_NOT_SPACE_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f]")


def _plain(text: str) -> str:
    """Free text without control characters (PostgreSQL refuses a NUL in text, so one in an EHR's
    name or visit type failed the clinic's whole night): those that are spacing (tab, newline,
    NEL...) become one space, the others are dropped; text without any is left as it is."""
    if not _CONTROL.search(text):
        return text
    return " ".join(_NOT_SPACE_CONTROL.sub("", text).split())


def _rows(snapshot_id: int, user: User, appointments):
    for a in appointments:
        row = {"snapshot": snapshot_id, "ehr_appointment_id": a.id, "provider": user.id, "provider_npi": user.npi,
               "provider_name": user.display_name, "start": a.start, "end": a.end, "status": a.status,
               "appointment_type": a.appointment_type, "reason": a.reason, "location": a.location,
               "patient_id": a.patient.id, "patient_first_name": a.patient.first_name,
               "patient_last_name": a.patient.last_name, "patient_date_of_birth": a.patient.date_of_birth,
               "patient_sex": a.patient.sex}
        for name, length in _TEXT_COLUMNS:
            row[name] = _plain(row[name])[:length]
        yield row


class BuildDeadlineExceeded(DeadlineExceeded):
    """One clinic's build ran past `SVC_SNAPSHOT_BUILD_DEADLINE`: its night fails (not retried)."""


@dataclass(frozen=True)
class BuildDeadline:
    """When one clinic's build must end: `SVC_SNAPSHOT_BUILD_DEADLINE` after it started, on the
    monotonic clock of the connector's own deadlines. Started before the connector, whose requests
    `Bounds.snapshot` holds to the same length from its creation, so they end no earlier than this."""

    seconds: float
    ends: float

    @classmethod
    def start(cls, settings) -> BuildDeadline:
        seconds = float(settings.snapshot_build_deadline)
        return cls(seconds, time.monotonic() + seconds)

    def passed(self) -> bool:
        return time.monotonic() >= self.ends

    def exceeded(self) -> BuildDeadlineExceeded:
        return BuildDeadlineExceeded("deadline", f"The clinic's snapshot was not built within its deadline "
                                                 f"(SVC_SNAPSHOT_BUILD_DEADLINE, {self.seconds:g} s): the build "
                                                 f"was stopped and nothing of it was published.")

    def check(self) -> None:
        """At each physician and batch of rows: raise `BuildDeadlineExceeded` once the deadline passed."""
        if self.passed():
            raise self.exceeded()

    def overdue(self, exc: ConnectorError) -> bool:
        """`exc` ended the build because its deadline passed: the EHR's request stopped at it
        (`DeadlineExceeded`), or a retry could not wait past it (`ConnectorUnavailable`, which would
        otherwise be retried and hold a worker for another deadline)."""
        return (isinstance(exc, (DeadlineExceeded, ConnectorUnavailable))
                and not isinstance(exc, BuildDeadlineExceeded) and self.passed())


class BuildInProgress(Exception):
    """Another builder holds a live lease on this (organization, night)."""


class BuildTakenOver(BuildInProgress):
    """This build lost its lease while it ran (its row was swept or taken over): it stops, and the
    night is the sweep's re-queued task's or the other builder's."""


def claim_build(runtime, organization_id: str, night: dt.date) -> Snapshot | None:
    """Start the build of (organization, night): its one `building` row, leased to this builder.

    None while another builder holds a live lease (a unique index allows one `building` row per
    organization and night). A lapsed lease is taken over: its rows are removed first."""
    settings, db, clock = runtime.settings, runtime.db, runtime.clock
    now = clock.now()
    lease = dt.timedelta(seconds=lease_seconds(settings))
    stale = ((Snapshot.organization == organization_id) & (Snapshot.snapshot_date == night)
             & (Snapshot.status == "building")
             & ((Snapshot.lease_until < now) | (Snapshot.lease_until.is_null() & (Snapshot.started_at < now - lease))))
    with db.atomic():
        SnapshotAppointment.delete().where(SnapshotAppointment.snapshot.in_(Snapshot.select(Snapshot.id).where(stale))).execute()
        Snapshot.delete().where(stale).execute()
    try:
        with db.atomic():
            return Snapshot.create(organization=organization_id, snapshot_date=night, status="building",
                                   started_at=now, lease_until=now + lease, lease_owner=secrets.token_hex(16))
    except peewee.IntegrityError:
        return None


def build_snapshot(runtime, organization_id: str, night: dt.date) -> Snapshot:
    """Fetch and store `night`'s snapshot of one organization, then publish it atomically.

    The `building` snapshot carries a lease renewed while it is written: if this process dies,
    the recovery sweep (workers.recovery) removes it and queues the night again. Raises
    `BuildInProgress` when another builder is building the same night right now, and
    `BuildDeadlineExceeded` (its snapshot discarded) past `SVC_SNAPSHOT_BUILD_DEADLINE`."""
    settings, db = runtime.settings, runtime.db
    deadline = BuildDeadline.start(settings)
    organization = Organization.get_by_id(organization_id)
    source = schedule_source(runtime, organization, Bounds.snapshot(settings),  # a bound hit fails the night
                             ehr_recorder(runtime, organization_id))
    window_start, _ = night_window(settings, night)
    providers = eligible_providers(settings, organization_id, night)
    snapshot = claim_build(runtime, organization_id, night)
    if snapshot is None:
        raise BuildInProgress(f"the snapshot of {organization_id} for {night} is being built by another process")
    try:
        count = 0
        with snapshot_lease_keeper(runtime, snapshot) as keeper:
            for user in providers:
                if keeper.lost.is_set():
                    raise BuildTakenOver(f"snapshot {snapshot.id} was taken over while it was built")
                deadline.check()
                provider = Provider(user_id=user.id, npi=user.npi, name=user.display_name,
                                    ehr_username=user.ehr_username)
                rows = _rows(snapshot.id, user,
                             source.fetch_appointments(provider, window_start, window_start + COVERAGE))
                for chunk in peewee.chunked(rows, INSERT_CHUNK):
                    deadline.check()
                    count += _insert(runtime, snapshot, chunk)
            source.finish_night()   # e.g. Epic refused every Patient read: fail, publish nothing
    except ConnectorError as exc:
        _discard(db, snapshot)
        if deadline.overdue(exc):
            raise deadline.exceeded() from exc
        raise
    except BaseException:
        _discard(db, snapshot)
        raise
    skipped = source.skipped
    if skipped is not None and skipped.total():
        snapshot.skipped = json.dumps(skipped.as_dict())
        log.warning("snapshot of %s for %s: %d appointments the EHR sent were left out: %s", organization_id, night,
                    skipped.total(), "; ".join(f"{reason}: {e['count']} (e.g. {', '.join(e['appointments']) or '-'})"
                                               for reason, e in skipped.as_dict().items()))
    publish(runtime, snapshot)
    log.info("snapshot of %s for %s: %d appointments of %d providers", organization_id, night, count, len(providers))
    return snapshot


def _insert(runtime, snapshot: Snapshot, rows) -> int:
    """Store rows of the night, in the transaction that renews the build's lease (none once it lost it)."""
    with runtime.db.atomic():
        if not extend_snapshot_lease(runtime, snapshot):
            raise BuildTakenOver(f"snapshot {snapshot.id} was taken over while it was built")
        return _INSERT_APPOINTMENT.insert_many(rows)


def build_or_await(runtime, organization_id: str, night: dt.date, poll: float = 0.5) -> tuple[str, Snapshot]:
    """Build the night, or, while another builder holds a live lease, wait for it to end.

    Returns ("built", ours) or ("found", theirs) when the other builder published it; when it
    failed or died, its lease lapses and this builder takes over."""
    while True:
        waiting_since = runtime.clock.now()
        try:
            return "built", build_snapshot(runtime, organization_id, night)
        except BuildInProgress:
            pass
        while _live_build(runtime, organization_id, night):
            time.sleep(poll)
        done = (Snapshot.select().where((Snapshot.organization == organization_id) & (Snapshot.snapshot_date == night)
                                        & (Snapshot.status == "complete") & (Snapshot.completed_at >= waiting_since))
                .first())
        if done is not None:
            return "found", done


def _live_build(runtime, organization_id: str, night: dt.date) -> bool:
    return Snapshot.select().where(
        (Snapshot.organization == organization_id) & (Snapshot.snapshot_date == night)
        & (Snapshot.status == "building") & (Snapshot.lease_until >= runtime.clock.now())).exists()


def publish(runtime, snapshot: Snapshot) -> None:
    """Make `snapshot` the one of its night, in one transaction (readers switch atomically).

    It replaces the night's earlier complete snapshot and prunes complete ones of old nights; a
    `building` one of an old night belongs to a live builder (or to the sweep) and is left alone.
    A build that lost its lease changes nothing (`BuildTakenOver`)."""
    org, night = snapshot.organization_id, snapshot.snapshot_date
    with runtime.db.atomic():
        if not (Snapshot.update(status="complete", completed_at=runtime.clock.now(), skipped=snapshot.skipped)
                .where(snapshot_held(snapshot)).execute()):  # our lease lapsed: the night is another's
            raise BuildTakenOver(f"snapshot {snapshot.id} was taken over while it was built")
        replaced = [s.id for s in Snapshot.select(Snapshot.id).where(
            (Snapshot.organization == org) & (Snapshot.id != snapshot.id)
            & ((Snapshot.snapshot_date == night)
               | ((Snapshot.snapshot_date < night - dt.timedelta(days=KEEP_NIGHTS - 1)) & (Snapshot.status == "complete"))))]
        if replaced:
            SnapshotAppointment.delete().where(SnapshotAppointment.snapshot.in_(replaced)).execute()
            Snapshot.delete().where(Snapshot.id.in_(replaced)).execute()
    snapshot.status = "complete"


def _discard(db, snapshot: Snapshot) -> None:
    """Remove the build's unfinished snapshot, unless it lost it (the row is then another's, or gone)."""
    try:
        with db.atomic():
            SnapshotAppointment.delete().where(SnapshotAppointment.snapshot.in_(
                Snapshot.select(Snapshot.id).where(snapshot_held(snapshot)))).execute()
            Snapshot.delete().where(snapshot_held(snapshot)).execute()
    except peewee.PeeweeException:
        log.exception("could not remove unfinished snapshot %s", snapshot.id)


def organizations_to_sync() -> list[str]:
    """Organizations where at least one application is installed (data is limited to those)."""
    return [row.organization_id for row in
            Installation.select(Installation.organization).distinct().order_by(Installation.organization)]


@dataclass
class NightReport:
    """What `run_night` did: each organization's appointment count (or `failed: why`), which
    organizations it built and which it found built by another builder (the scheduler, another run),
    and, per organization, what the EHR sent that the night left out (`{reason: {"count",
    "appointments": [first ids]}}`)."""

    organizations: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)
    built: list = field(default_factory=list)
    found_built: list = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not any(isinstance(v, str) for v in self.organizations.values())


def run_night(runtime, night: dt.date, organization_ids: list[str] | None = None) -> NightReport:
    """Build `night`'s snapshots now, in this process (`svc-auth snapshot run`), cooperating with
    any other builder of the same night (`build_or_await`).

    Each organization's night is isolated: any failure (an EHR's error, or an unexpected exception,
    logged with its traceback) is that organization's `failed: why`, and the next one is built (on
    a fresh database connection when the failure was the database's: `HeldConnections.run`)."""
    report = NightReport()
    for org_id in organization_ids or organizations_to_sync():
        try:
            outcome, snapshot, count = runtime.connections.run(_build_counted, runtime, org_id, night)
        except ConnectorError as exc:
            log.error("snapshot of %s for %s failed: %s", org_id, night, exc)
            report.organizations[org_id] = f"failed: {exc}"
            continue
        except Exception as exc:
            log.exception("snapshot of %s for %s failed unexpectedly; going on with the next organization",
                          org_id, night)
            report.organizations[org_id] = f"failed: unexpected error: {_one_line(exc)} (traceback in the log)"
            continue
        (report.built if outcome == "built" else report.found_built).append(org_id)
        if snapshot.skipped:
            report.skipped[org_id] = json.loads(snapshot.skipped)
        report.organizations[org_id] = count
    return report


def _build_counted(runtime, organization_id: str, night: dt.date) -> tuple[str, Snapshot, int]:
    """`build_or_await`, and the number of appointments of the snapshot it built or found."""
    outcome, snapshot = build_or_await(runtime, organization_id, night)
    return outcome, snapshot, SnapshotAppointment.select().where(SnapshotAppointment.snapshot == snapshot.id).count()


def _one_line(exc: Exception) -> str:
    """`Type: message` of an exception, on one line (a database error's detail lines stay in the log)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


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
    except BuildInProgress as exc:
        # Another builder (a `snapshot run`, a redelivery, the one that took over a lapsed lease)
        # has it, or the sweep re-queued it: it publishes the night, or, if it dies, its lease
        # lapses and the sweep queues the night again.
        log.info("%s; leaving it to that builder", exc)
    except ConnectorUnavailable:
        raise  # retried; yesterday's snapshot keeps being served meanwhile
    except (ConnectorError, Organization.DoesNotExist) as exc:
        log.error("snapshot of %s for %s failed for good: %s", organization_id, night, exc)
        record_sync_failure(organization_id, dt.date.fromisoformat(night))
