"""A `db migrate` killed (SIGKILL: a deploy's timeout, an OOM kill) inside a migration loses nothing.

The previous release's database gets a ledger big enough that migration 5501 (SQLite: rebuild
`billable_use`, copy every row, drop the old table, rename; PostgreSQL: drop its foreign keys, add two
columns, rewrite every row with the names) takes a while; `svc-auth db migrate` runs as a child
process and is killed while it is provably inside that migration:

- SQLite: the write-ahead log has grown past what the small tables' steps could write (the rebuild's
  pages spill into it before the commit), the backup copy is written, and no version row is committed;
- PostgreSQL: the child's server process holds the runner's advisory lock and is running the
  migration's `UPDATE "billable_use"` (`pg_locks`, `pg_stat_activity`).

After the kill the database is still the previous release's (schema number, every row). A second
`db migrate` then migrates it: the newest schema number, every ledger row with its id and values (and
the copied names), every other table's rows, `db status` clean, and a `serve` starts and answers as
the upgrade tests check. Two more kills: a PostgreSQL migrator waiting for a table lock (its server
process must end with it) and an SQLite migrator copying its backup (no partial file under a backup's name).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jwt

from helpers.environment import ROOT
from helpers.http import LiveHttp
from helpers.processes import free_port, start_process, stop_process, wait_until
from helpers.releases import table_counts
from test_upgrade import BACKUP_LINE, BOOKKEEPING, RELEASES, restore, run_sql, svc_auth, works_as_before

MONTHS_PER_USER = 20_000
"""Ledger rows per user of the fixture (three users): enough that 5501 runs for a second or more."""

LEDGER = ('SELECT "id", "application_id", "organization_id", "user_id", "month", "first_verified_at" '
          'FROM "billable_use" ORDER BY "id"')


def fill_the_ledger(backend: str, url: str, seed: dict) -> None:
    """MONTHS_PER_USER rows for each user of the seed clinic and app (months 1000-01, 1000-02, ...)."""
    users = (seed["physician_user_id"], seed["other_user_id"])
    [(third,)] = run_sql(url, 'SELECT "id" FROM "user" WHERE "id" NOT IN (%s, %s)', users)
    if backend == "sqlite":
        series = (f'WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < {MONTHS_PER_USER}) '
                  f'SELECT printf(\'%04d-%02d\', 1000 + i / 12, i % 12 + 1), '
                  f'datetime(\'2026-01-01\', \'+\' || i || \' seconds\') FROM n')
    else:
        series = (f'SELECT to_char(1000 + i / 12, \'FM0000\') || \'-\' || to_char(i %% 12 + 1, \'FM00\'), '
                  f'TIMESTAMP \'2026-01-01\' + i * INTERVAL \'1 second\' FROM generate_series(0, {MONTHS_PER_USER - 1}) i')
    for user in (*users, third):
        run_sql(url, f'INSERT INTO "billable_use" ("application_id", "organization_id", "user_id", "month", '
                     f'"first_verified_at") SELECT %s, %s, %s, m.* FROM ({series}) m',
                (seed["application_id"], seed["organization_id"], user))


def in_the_migration(backend: str, url: str, small: int):
    """A check that `db migrate` is inside migration 5501 (not committed: the caller checks after the
    kill), returning what it saw. SQLite: the write-ahead log holds more than `small` (four times the
    size of every table but the ledger: what the other steps could write) and the backup is written."""
    if backend == "sqlite":
        path = Path(url[len("sqlite:///"):])

        def check():
            wal = path.with_name(path.name + "-wal")
            size = wal.stat().st_size if wal.exists() else 0
            backups = list(path.parent.glob(path.name + ".schema-*.bak"))
            return size > small and backups and {"wal_bytes": size, "backup": str(backups[0])}
        return check
    import psycopg2
    con = psycopg2.connect(url)
    con.autocommit = True

    def check():
        with con.cursor() as cur:
            cur.execute("SELECT a.pid, a.query FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid "
                        "WHERE a.datname = current_database() AND a.state = 'active' AND l.locktype = 'advisory' "
                        "AND l.granted AND a.query LIKE 'UPDATE \"billable_use\"%%' AND a.pid <> pg_backend_pid()")
            row = cur.fetchone()
        return row and {"server_pid": row[0], "query": row[1][:80]}
    check.close = con.close
    return check


def committed_schema(url: str) -> int:
    return run_sql(url, 'SELECT MAX("version") FROM "schema_version"')[0][0]


def test_a_migrate_killed_inside_a_migration_loses_nothing(backend, tmp_path, scratch_database):
    url, env, day = restore(RELEASES[-1], backend, tmp_path, scratch_database)
    small = 4 * (tmp_path / "svc.db").stat().st_size if backend == "sqlite" else 0
    fill_the_ledger(backend, url, day["seed"])
    before_schema = committed_schema(url)
    before_counts = table_counts(url)
    ledger = [tuple(map(str, row)) for row in run_sql(url, LEDGER)]
    assert len(ledger) == 3 * MONTHS_PER_USER

    child = subprocess.Popen([sys.executable, "-m", "cli", "db", "migrate"], cwd=str(ROOT), env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    check = in_the_migration(backend, url, small)
    try:
        def inside():
            if child.poll() is not None:
                raise AssertionError(f"db migrate ended before it was killed: {child.communicate()}")
            return check()
        deadline, seen = time.monotonic() + 60, None
        while not seen and time.monotonic() < deadline:  # polled fast: the migration lasts about a second
            seen = inside()
            time.sleep(0.005)
        assert seen, "db migrate never seen inside migration 5501"
        os.kill(child.pid, signal.SIGKILL)
        child.communicate()
        assert child.returncode == -signal.SIGKILL
        if backend == "postgresql":  # the server notices the client is gone, rolls back, and ends
            wait_until(lambda: not run_sql(url, "SELECT 1 FROM pg_stat_activity WHERE pid = %s",
                                           (seen["server_pid"],)), what="the killed migrator's server process ending")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        getattr(check, "close", lambda: None)()

    # The kill landed before the commit: the database is the previous release's, every row.
    assert committed_schema(url) == before_schema, seen
    assert table_counts(url) == before_counts, seen
    assert [tuple(map(str, row)) for row in run_sql(url, LEDGER)] == ledger

    again = svc_auth(env, "db", "migrate")
    assert again.returncode == 0 and "migration 5501" in again.stdout, again.stdout + again.stderr
    status = svc_auth(env, "db", "status", "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    found = json.loads(status.stdout)
    assert found["pending"] == [] and found["schema"] == found["code"], found
    after = table_counts(url)
    assert {t: n for t, n in after.items() if t in before_counts and t not in BOOKKEEPING} == \
        {t: n for t, n in before_counts.items() if t not in BOOKKEEPING}
    assert [tuple(map(str, row)) for row in run_sql(url, LEDGER)] == ledger
    names = run_sql(url, 'SELECT COUNT(*) FROM "billable_use" WHERE "organization_name" IS NULL OR "user_email" IS NULL')
    assert names == [(0,)]
    if backend == "sqlite":
        assert run_sql(url, "PRAGMA integrity_check") == [("ok",)]
        assert run_sql(url, "PRAGMA foreign_key_check") == []
    assert "billable_use_before_5501" not in table_counts(url)

    made_at = jwt.decode(day["client_token"], options={"verify_signature": False})["iat"]
    env["SVC_CLOCK_OFFSET"] = str(made_at + 600 - time.time())
    port = free_port()
    proc = start_process(["serve", "--port", str(port)], env, port, log_path=tmp_path / "serve.log")
    try:
        works_as_before(LiveHttp(f"http://127.0.0.1:{port}"), day)
    finally:
        stop_process(proc)



def test_a_migrate_killed_while_it_waits_for_a_lock_leaves_no_server_process_behind(tmp_path, scratch_database):
    """PostgreSQL: a migration waiting for a table lock (a long transaction of a running `serve` reads the
    ledger) is killed, as a deploy's timeout would. Its server process must end with it: left behind, it
    would keep waiting in the lock queue, holding the runner's advisory lock (the next `db migrate`,
    and every `serve` starting with auto-migrate, wait for it) and its own locks (every later query of
    the ledger queues behind it) until that transaction ends. The runner asks the server to check its
    client every second (`client_connection_check_interval`)."""
    import psycopg2
    url, env, day = restore(RELEASES[-1], "postgresql", tmp_path, scratch_database)
    reader = psycopg2.connect(url)  # a long transaction that has read the ledger: ACCESS SHARE until it ends
    reader.cursor().execute('SELECT COUNT(*) FROM "billable_use"')
    watcher = psycopg2.connect(url)
    watcher.autocommit = True
    child = subprocess.Popen([sys.executable, "-m", "cli", "db", "migrate"], cwd=str(ROOT), env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def waiting():
            if child.poll() is not None:
                raise AssertionError(f"db migrate ended before it was killed: {child.communicate()}")
            with watcher.cursor() as cur:
                cur.execute("SELECT a.pid FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid "
                            "WHERE a.datname = current_database() AND a.wait_event_type = 'Lock' "
                            "AND a.query LIKE 'ALTER TABLE \"billable_use\"%%' AND l.locktype = 'advisory' "
                            "AND l.granted")
                row = cur.fetchone()
            return row and row[0]
        server_pid = wait_until(waiting, what="db migrate waiting for the ledger's lock in migration 5501")
        os.kill(child.pid, signal.SIGKILL)
        child.communicate()

        def ended():
            with watcher.cursor() as cur:
                cur.execute("SELECT COUNT(*) FROM pg_stat_activity WHERE pid = %s", (server_pid,))
                return cur.fetchone()[0] == 0
        wait_until(ended, timeout=10, what="the killed migrator's server process ending (the reader still reads)")
        with watcher.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
                        "(SELECT oid FROM pg_database WHERE datname = current_database())")
            assert cur.fetchone()[0] == 0  # the runner's lock is free
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        reader.close()
        watcher.close()
    assert committed_schema(url) == 2903
    again = svc_auth(env, "db", "migrate")
    assert again.returncode == 0 and "migration 5501" in again.stdout, again.stdout + again.stderr
    assert table_counts(url)["billable_use"] == day["counts"]["billable_use"]


def test_a_migrate_killed_while_it_writes_the_sqlite_backup_leaves_no_partial_backup(tmp_path, scratch_database):
    """SQLite: `db migrate` first copies the database to `<file>.schema-N.<time>.bak`. Killed while it
    copies, it must not leave a file of that name that is not the whole database (an operator would
    restore it): the copy is written as `….bak.partial` and renamed when complete. The next run
    deletes the partial copy, writes its own and migrates."""
    url, env, day = restore(RELEASES[-1], "sqlite", tmp_path, scratch_database)
    fill_the_ledger("sqlite", url, day["seed"])
    before = table_counts(url)
    database = tmp_path / "svc.db"
    child = subprocess.Popen([sys.executable, "-m", "cli", "db", "migrate"], cwd=str(ROOT), env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def copying():  # a copy beside the database, not yet the database's size
            if child.poll() is not None:
                raise AssertionError(f"db migrate ended before it was killed: {child.communicate()}")
            copies = [p for p in tmp_path.glob("svc.db.schema-*") if not p.name.endswith("-journal")]
            return [p for p in copies if p.stat().st_size < database.stat().st_size]
        deadline, seen = time.monotonic() + 60, None
        while not seen and time.monotonic() < deadline:
            seen = copying()
            time.sleep(0.002)
        assert seen, "db migrate never seen writing its backup"
        os.kill(child.pid, signal.SIGKILL)
        child.communicate()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert committed_schema(url) == 2903 and table_counts(url) == before
    backups = sorted(tmp_path.glob("svc.db.schema-*.bak"))
    assert not backups or table_counts(f"sqlite:///{backups[0]}") == before, \
        f"killed while copying {seen[0].name}, {backups[0].name} is not the whole database"
    assert sorted(p.name for p in tmp_path.glob("svc.db.schema-*.bak.partial")) == [seen[0].name], seen

    again = svc_auth(env, "db", "migrate")
    assert again.returncode == 0 and "migration 5501" in again.stdout, again.stdout + again.stderr
    backup = BACKUP_LINE.search(again.stdout)
    assert backup and table_counts(f"sqlite:///{backup.group(1)}") == before, again.stdout
    assert not list(tmp_path.glob("svc.db.schema-*.partial*")), list(tmp_path.iterdir())
