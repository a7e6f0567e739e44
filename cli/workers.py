"""`svc-auth worker`, `svc-auth scheduler` and `svc-auth snapshot run [--date YYYY-MM-DD]`."""
from __future__ import annotations

import datetime as dt
import logging
import signal
import threading

from cli.common import UsageError, emit, existing, with_runtime

log = logging.getLogger("svc_auth.workers")
MAX_THREADS = 256  # `worker --threads`: more is a typo (2**64 would start threads until memory ran out)
FIRST_NIGHT, LAST_NIGHT = dt.date(2000, 1, 1), dt.date(9998, 12, 31)  # `snapshot run --date`


def register(commands) -> None:
    p = commands.add_parser("worker", help="run a Dramatiq worker (needs SVC_REDIS_URL)")
    p.add_argument("--threads", type=int, default=None, help="worker threads, 1 to 256 (default SVC_WORKER_THREADS)")
    p.add_argument("--queues", nargs="*", default=None, help="only consume these queues (snapshots, charts, exports)")
    p.set_defaults(handler=with_runtime(run_worker, check_redis=True))

    p = commands.add_parser("scheduler", help="queue the nightly appointment sync at SVC_SYNC_WINDOW")
    p.add_argument("--interval", type=float, default=30.0, help="seconds between checks, above 0 and below 86400 (default 30)")
    p.add_argument("--once", action="store_true", help="check once and exit (for cron)")
    p.set_defaults(handler=with_runtime(run_scheduler_command, check_redis=True))

    snapshot = commands.add_parser("snapshot", help="appointment snapshots").add_subparsers(dest="action", required=True)
    p = snapshot.add_parser("run", help="build a night's appointment snapshots now, in this process")
    p.add_argument("--date", help="the night, YYYY-MM-DD (default: the coming night: the one whose sync window "
                                  "is open now, else the next one)")
    p.add_argument("--org", action="append", help="only this organization (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=with_runtime(run_snapshot))


def _wait_for_signal() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def run_worker(runtime, args) -> int:
    if not runtime.settings.redis_url:
        raise UsageError("SVC_REDIS_URL is not set: without Redis, tasks run in the worker thread inside `svc-auth serve`")
    if args.threads is not None and not 1 <= args.threads <= MAX_THREADS:
        raise UsageError(f"--threads must be between 1 and {MAX_THREADS}")
    runtime.ehr_keys.require_open()  # the nights and charts sign with them: one no key opens stops it here, as serve
    stop = _wait_for_signal()
    from keys.holders import KeyHeartbeat
    from workers.loops import run_every
    heartbeat = KeyHeartbeat(runtime, "worker").start(run_every)  # its SVC_HMAC_KEY noted before a task links a record
    try:
        return _consume(runtime, args, stop)
    finally:
        heartbeat.stop()


def _consume(runtime, args, stop: threading.Event) -> int:
    queue = runtime.task_queue
    if args.queues:
        unknown = set(args.queues) - set(queue.broker.get_declared_queues())
        if unknown:
            raise UsageError(f"unknown queue(s) {', '.join(sorted(unknown))}; choose from snapshots, charts")
        import dramatiq
        queue.worker = dramatiq.Worker(queue.broker, queues=set(args.queues),
                                       worker_threads=args.threads or runtime.settings.worker_threads)
        queue.worker.start()
    else:
        queue.start_worker(args.threads)
    log.info("worker consuming %s", ", ".join(sorted(args.queues or queue.broker.get_declared_queues())))
    from workers.recovery import start_recovery_thread
    stop_recovery = start_recovery_thread(runtime)  # re-queues the work of workers that died
    stop.wait()
    stop_recovery.set()
    log.info("worker stopping: finishing the tasks in hand")
    if queue.worker is not None:
        queue.worker.stop(timeout=30_000)  # the tasks in hand link their records before the row goes
        queue.worker = None
    return 0  # with_runtime closes the runtime


def run_scheduler_command(runtime, args) -> int:
    from workers.retention import retention_due
    from workers.scheduler import run_scheduler, tick
    if not 0 < args.interval < 86400:  # also refuses nan and inf (an Event.wait(inf) overflows)
        raise UsageError("--interval must be a number of seconds above 0 and below 86400")
    runtime.task_queue  # noqa: B018  (connect the broker before the first tick)
    if args.once:
        night = tick(runtime)
        print(f"queued the nightly sync of {night}" if night else "nothing to queue now")
        retention_due(runtime)  # from cron too: today's retention sweep, if no scheduler ran it yet
        return 0
    stop = _wait_for_signal()
    log.info("scheduler running; sync window %s UTC", runtime.settings.sync_window)
    run_scheduler(runtime, stop, args.interval)
    return 0


def run_snapshot(runtime, args) -> int:
    from models.directory import Organization
    from workers.snapshot import coming_night, run_night
    try:
        night = dt.date.fromisoformat(args.date) if args.date else coming_night(runtime.settings, runtime.clock.now())
    except ValueError:
        raise UsageError(f"--date must be YYYY-MM-DD, got {args.date[:80]!r}") from None
    if not FIRST_NIGHT <= night <= LAST_NIGHT:  # the night's window and session TTL must stay within dates
        raise UsageError(f"--date must be a night from {FIRST_NIGHT} to {LAST_NIGHT}, got {night}")
    for org_id in args.org or ():
        existing(Organization.get_or_none(Organization.id == org_id), "organization", org_id)
    from keys.holders import KeyHeartbeat
    from workers.loops import run_every
    heartbeat = KeyHeartbeat(runtime, "snapshot").start(run_every)  # the night's ehr.fetch records link under its key
    try:
        report = run_night(runtime, night, args.org)
    finally:
        heartbeat.stop()
    emit({"snapshot_date": night.isoformat(), "organizations": report.organizations,
          "built": report.built, "found_built": report.found_built, "skipped": report.skipped}, args.json)
    return 0 if report.complete else 1
