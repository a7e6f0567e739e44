"""Bulk data for the PostgreSQL benchmarks: a throwaway database and a fleet of clinics.

`scratch_database()` creates `svc_bench_<random>` next to the given PostgreSQL URL and drops it at
the end. `seed_fleet()` writes organizations, physicians, one application installed everywhere and
every physician's authorization with COPY (seconds for tens of thousands of rows); the service's
own migrations create the tables first, so the schema is exactly the production one.
"""
from __future__ import annotations

import contextlib
import csv
import datetime as dt
import io
import secrets
from urllib.parse import urlsplit, urlunsplit

import peewee

DEFAULT_POSTGRES_URL = "postgresql://postgres:postgres@127.0.0.1:5432/postgres"  # password: see bench-deps


def postgres_reachable(url: str) -> str | None:
    """None when `url` answers, else why not (the benchmark is then skipped, not failed)."""
    import psycopg2
    try:
        psycopg2.connect(url, connect_timeout=3).close()
        return None
    except Exception as exc:  # noqa: BLE001
        return f"PostgreSQL not reachable at {url}: {str(exc).strip().splitlines()[0]}"


def redis_reachable(url: str) -> str | None:
    import redis
    try:
        redis.Redis.from_url(url, socket_connect_timeout=3).ping()
        return None
    except Exception as exc:  # noqa: BLE001
        return f"Redis not reachable at {url}: {exc}"


@contextlib.contextmanager
def scratch_database(admin_url: str):
    """A fresh database on the server of `admin_url`; yields its URL, drops it afterwards."""
    import psycopg2
    name = f"svc_bench_{secrets.token_hex(4)}"
    admin = psycopg2.connect(admin_url)
    admin.autocommit = True
    admin.cursor().execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(admin_url)
    try:
        yield urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))
    finally:
        admin.cursor().execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@contextlib.contextmanager
def redis_namespace(url: str, namespace: str):
    """Yields `namespace`; afterwards deletes every key under it (and only those)."""
    try:
        yield namespace
    finally:
        import redis
        client = redis.Redis.from_url(url)
        keys = list(client.scan_iter(f"{namespace}:*"))
        if keys:
            client.delete(*keys)


def copy_rows(db: peewee.Database, model, columns: list[str], rows, chunk: int = 100_000) -> int:
    """COPY `rows` (tuples in `columns` order; None is NULL) into `model`'s table."""
    table = model._meta.table_name
    column_list = ", ".join(f'"{c}"' for c in columns)
    sql = f'COPY "{table}" ({column_list}) FROM STDIN WITH (FORMAT csv, NULL \'\\N\')'
    conn = db.connection()
    total = 0
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    count = 0

    def flush():
        buffer.seek(0)
        with conn.cursor() as cursor:
            cursor.copy_expert(sql, buffer)
        buffer.seek(0)
        buffer.truncate()

    for row in rows:
        writer.writerow(["\\N" if v is None else v for v in row])
        count += 1
        if count == chunk:
            flush()
            total += count
            count = 0
    if count:
        flush()
        total += count
    conn.commit() if not conn.autocommit else None
    return total


def seed_fleet(db: peewee.Database, application_id: str, organizations: int, physicians: int,
               now: dt.datetime) -> dict[str, list[tuple[str, str, str]]]:
    """`organizations` clinics with `physicians` physicians each, the application installed in
    every clinic and authorized by every physician. Returns {org id: [(user id, npi, name), ...]}."""
    from models.application import Authorization, Installation
    from models.directory import Organization, User
    fleet: dict[str, list[tuple[str, str, str]]] = {}
    orgs, users = [], []
    for o in range(organizations):
        org_id = f"org_bench{o:05d}"
        orgs.append((org_id, f"Bench Clinic {o}", "sandbox", f"https://ehr.example/bench/{o}", "", "smart-backend", now))
        fleet[org_id] = []
        for p in range(physicians):
            user_id = f"usr_bench{o:05d}p{p:03d}"
            npi = f"{1000000000 + o * 1000 + p}"
            fleet[org_id].append((user_id, npi, f"Doctor {o}-{p}"))
            users.append((user_id, org_id, f"doc{o}-{p}@bench.example", "Doctor", f"{o}-{p}", f"d{o}p{p}", npi,
                          None, now, now))
    copy_rows(db, Organization, ["id", "name", "ehr", "ehr_url", "fhir_client_id", "fhir_auth", "created_at"], orgs)
    copy_rows(db, User, ["id", "organization_id", "email", "given_name", "family_name", "ehr_username", "npi",
                         "invited_at", "activated_at", "created_at"], users)
    copy_rows(db, Installation, ["application_id", "organization_id", "installed_at", "activation_status",
                                 "trial_started_at"], ((application_id, org, now, "Enabled", None) for org in fleet))
    copy_rows(db, Authorization, ["application_id", "user_id", "first_verified_at", "last_verified_at"],
              ((application_id, u[0], now, now) for u in users))
    return fleet
