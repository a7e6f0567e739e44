"""Embedded SQLite: a transaction that reads and then writes waits for a concurrent writer instead
of failing at once with "database is locked". A deferred transaction cannot upgrade a WAL read
snapshot that another connection has moved past, and busy_timeout does not help it: `serve --demo`
died that way when its demo seeding (read, then write) met the nightly sync of the embedded worker."""
from __future__ import annotations

import sqlite3
import threading

from models.db import open_database


def test_a_read_then_write_transaction_waits_for_a_concurrent_writer(tmp_path):
    url = f"sqlite:///{tmp_path}/embedded.db"
    ours, theirs = open_database(url), open_database(url)
    ours.execute_sql("CREATE TABLE t (x INTEGER)")
    errors = []

    def write():
        try:
            theirs.execute_sql("INSERT INTO t VALUES (2)")
        except Exception as exc:  # noqa: BLE001  (reported below)
            errors.append(exc)
        finally:
            theirs.close()
    other = threading.Thread(target=write)
    with ours.atomic():
        assert ours.execute_sql("SELECT count(*) FROM t").fetchone() == (0,)
        other.start()
        other.join(0.5)
        # Our transaction holds the write lock from its BEGIN: the other writer waits for it...
        assert other.is_alive(), "the concurrent write went through inside our transaction"
        ours.execute_sql("INSERT INTO t VALUES (1)")  # ...and our write never finds a stale snapshot
    other.join(15)
    assert not other.is_alive() and errors == []
    assert sorted(r[0] for r in ours.execute_sql("SELECT x FROM t")) == [1, 2]
    ours.close()



def test_processes_opening_a_rollback_journal_database_together_all_open_it_in_wal(tmp_path):
    """Opening switches the file to WAL, which needs it to itself: two processes switching at once
    (two `db migrate`s started together on a restored database) each hold a shared lock and want
    the exclusive one, and SQLite fails one of them at once with "database is locked", whatever
    busy_timeout says. Every opener must get the database, in WAL."""
    import subprocess
    import sys
    script = ("import sys; from models.db import open_database; db = open_database(sys.argv[1]); "
              "print('ready', flush=True); sys.stdin.readline(); db.connect(); "
              "print(db.execute_sql('PRAGMA journal_mode').fetchone()[0]); db.close()")
    for round_ in range(10):
        path = tmp_path / f"restored-{round_}.db"
        sqlite3.connect(path).execute("CREATE TABLE t (x INTEGER)").connection.close()
        procs = [subprocess.Popen([sys.executable, "-c", script, f"sqlite:///{path}"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
        for proc in procs:  # every one imported and waiting: then all open at once
            assert proc.stdout.readline() == "ready\n", proc.stderr.read()
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = [proc.communicate(timeout=60) for proc in procs]
        assert [proc.returncode for proc in procs] == [0] * 4 and all(out.strip() == "wal" for out, _ in outputs), \
            (round_, outputs)


def test_a_commit_is_on_disk_before_it_returns(tmp_path):
    """Every connection syncs the WAL at each commit (`synchronous=FULL`): under `NORMAL`, a commit
    could roll back after a power loss or an OS crash (SQLite's documentation), and with it a
    disclosure record whose response was already sent, leaving a shorter chain that still verifies."""
    db = open_database(f"sqlite:///{tmp_path}/svc.db")
    levels = []

    def level():
        levels.append(db.execute_sql("PRAGMA synchronous").fetchone()[0])
        db.close()
    for thread in [threading.Thread(target=level) for _ in range(2)]:
        thread.start()
        thread.join()
    assert levels == [2, 2]  # FULL, on each thread's own connection
