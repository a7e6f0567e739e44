"""Appointments page latency on PostgreSQL, through HTTP, at 10k / 100k / 1M snapshot rows.

1,000 organizations with 20 physicians each, one application installed everywhere and authorized
by every physician, one complete snapshot per organization. Rows are added in steps (10, then 100,
then 1,000 per organization: 10k, 100k, 1M in all), with `VACUUM ANALYZE` after each step. At
each step `GET /v1/appointments/{org}` is driven by wrk on one connection (latency, not queueing)
with a client-credentials token, for three kinds of page over random organizations: the first
page, a middle page and the last page (the deepest offset). The page query's plan at the deepest
offset is recorded with `EXPLAIN (ANALYZE, BUFFERS)`.

The serve process runs like production: PostgreSQL, Redis for rate limits (its own namespace,
appointments limit raised so the benchmark measures pages, not 429s), one process.
"""
from __future__ import annotations

import datetime as dt
import random
import secrets

from bench import loadgen
from bench.fleet import copy_rows, redis_namespace, scratch_database, seed_fleet
from bench.service import BenchService

ORGANIZATIONS = 1000
PHYSICIANS = 20
STEPS = (10, 100, 1000)  # rows per organization: 10k, 100k, 1M in all
PAGE = 50
TARGET_P99_MS = 10.0
NIGHT = dt.date(2026, 1, 15)


def _appointment_rows(fleet, snapshots: dict, start_index: int, per_org: int):
    rng = random.Random(start_index)
    base = dt.datetime.combine(NIGHT, dt.time(13, 0))
    for org_id, physicians in fleet.items():
        for i in range(start_index, start_index + per_org):
            user_id, npi, name = physicians[i % len(physicians)]
            start = base + dt.timedelta(days=rng.randrange(10), minutes=30 * rng.randrange(16))
            yield (snapshots[org_id], f"appt-{i}", user_id, npi, name, start, start + dt.timedelta(minutes=30),
                   "booked", "Follow-up", "Blood pressure check", "Room 2", f"pat-{i % 150}", "Pat", f"Ient{i}",
                   dt.date(1970, 1, 1) + dt.timedelta(days=i % 9000), "female")


APPOINTMENT_COLUMNS = ("snapshot_id", "ehr_appointment_id", "provider_id", "provider_npi", "provider_name", "start",
                       "end", "status", "appointment_type", "reason", "location", "patient_id",
                       "patient_first_name", "patient_last_name", "patient_date_of_birth", "patient_sex")


def _explain(db, query) -> dict:
    sql, params = db.get_sql_context().sql(query).query()
    plan = [row[0] for row in db.execute_sql("EXPLAIN (ANALYZE, BUFFERS) " + sql, params).fetchall()]
    text = "\n".join(plan)
    return {"sql": sql, "plan": plan, "uses_index": "Index" in text,
            "seq_scan_on_appointments": "Seq Scan on snapshot_appointment" in text,
            "execution_ms": next((float(line.split(":")[1].split()[0]) for line in plan
                                  if line.strip().startswith("Execution Time")), None)}


def explain_page(db, application_id: str, snapshot_id: int, organization_id: str, offset: int) -> dict:
    """The plans of the two queries a page runs (the page, and the total), as the handler builds them."""
    import peewee
    from partner_api.appointments import page_of, snapshot_rows
    rows = snapshot_rows(application_id, snapshot_id, organization_id)
    count = peewee.Select([rows.order_by().alias("_wrapped")], [peewee.fn.COUNT(peewee.SQL("1"))])
    return {"page": _explain(db, page_of(rows, offset, PAGE)), "total": _explain(db, count)}


def appointments_benchmarks(postgres_url: str, redis_url: str, seconds: float, say) -> dict:
    import peewee  # noqa: F401
    from playhouse.db_url import connect
    from models.appointments import Snapshot, SnapshotAppointment

    namespace = f"svc-bench-{secrets.token_hex(4)}"
    with scratch_database(postgres_url) as url, redis_namespace(redis_url, namespace):
        service = BenchService(url, extra_env={
            "SVC_REDIS_URL": redis_url, "SVC_REDIS_NAMESPACE": namespace,
            "SVC_RATE_LIMITS": "appointments=100000000/60"})
        service.seed()  # migrates the schema, registers the application
        db = connect(url)
        from models.clock import Clock
        from models.schema import bind_models
        bind_models(db)
        now = Clock().now()
        fleet = seed_fleet(db, service.application_id, ORGANIZATIONS, PHYSICIANS, now)
        copy_rows(db, Snapshot, ["organization_id", "snapshot_date", "status", "started_at", "completed_at"],
                  ((org, NIGHT, "complete", now, now) for org in fleet))
        snapshots = {row.organization_id: row.id for row in Snapshot.select(Snapshot.id, Snapshot.organization)}
        service.start_seeded()
        steps, loaded = [], 0
        try:
            token = service.client_token()
            rng = random.Random(1)
            org_ids = list(fleet)
            for per_org in STEPS:
                started = dt.datetime.now()
                added = copy_rows(db, SnapshotAppointment, APPOINTMENT_COLUMNS,
                                  _appointment_rows(fleet, snapshots, loaded, per_org - loaded))
                loaded = per_org
                db.execute_sql("VACUUM ANALYZE")  # as autovacuum would, after a bulk load
                try:  # flush the load's dirty pages now, not while pages are measured (needs superuser)
                    db.execute_sql("CHECKPOINT")
                except Exception:  # noqa: BLE001
                    pass
                load_seconds = (dt.datetime.now() - started).total_seconds()
                total_rows = SnapshotAppointment.select().count()
                say(f"appointments: {total_rows:,} rows ({per_org} per organization; +{added:,} rows in "
                    f"{load_seconds:.1f} s with COPY + VACUUM ANALYZE)")
                status, body = service.get_json(f"/v1/appointments/{org_ids[0]}?offset={max(0, per_org - PAGE)}", token)
                if status != 200 or body.get("total") != per_org or len(body["appointments"]) != min(PAGE, per_org):
                    raise RuntimeError(f"unexpected appointments page: {status} {str(body)[:300]}")
                pages = {"first": 0, "middle": max(0, per_org // 2 - PAGE // 2), "last": max(0, per_org - PAGE)}
                step = {"rows": total_rows, "rows_per_organization": per_org, "load_seconds": round(load_seconds, 1),
                        "pages": {}}
                for kind, offset in pages.items():
                    paths = service.tmp / f"paths-{kind}.txt"
                    paths.write_text("".join(f"/v1/appointments/{rng.choice(org_ids)}?offset={offset}&limit={PAGE}\n"
                                             for _ in range(5000)))
                    run = loadgen.run(service.url + "/", "paths", 1, seconds, env={
                        "BENCH_PATHS_FILE": str(paths), "BENCH_AUTHORIZATION": f"Bearer {token}"})
                    run["offset"] = offset
                    step["pages"][kind] = run
                    say(f"  {kind} page (offset {offset}): {run['rps']:.0f} req/s  p50 {run['p50_ms']:.2f} ms  "
                        f"p99 {run['p99_ms']:.2f} ms  errors {run['errors'] or 'none'}")
                plans = step["explain_last_page"] = explain_page(db, service.application_id, snapshots[org_ids[0]],
                                                                 org_ids[0], pages["last"])
                step["worst_p99_ms"] = max(r["p99_ms"] for r in step["pages"].values())
                say(f"  last page in PostgreSQL: page query {plans['page']['execution_ms']} ms, total "
                    f"{plans['total']['execution_ms']} ms; indexes used: "
                    f"{plans['page']['uses_index'] and plans['total']['uses_index']}, sequential scan of "
                    f"snapshot_appointment: {plans['page']['seq_scan_on_appointments'] or plans['total']['seq_scan_on_appointments']}")
                steps.append(step)
        finally:
            service.stop()
            db.close()
    return {"organizations": ORGANIZATIONS, "physicians_per_organization": PHYSICIANS, "page_size": PAGE,
            "connections": 1, "target_p99_ms": TARGET_P99_MS, "steps": steps,
            "worst_p99_ms": max(s["worst_p99_ms"] for s in steps)}
