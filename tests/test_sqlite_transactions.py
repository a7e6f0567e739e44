"""Embedded SQLite: a transaction that reads and then writes waits for a concurrent writer instead
of failing at once with "database is locked". A deferred transaction cannot upgrade a WAL read
snapshot that another connection has moved past, and busy_timeout does not help it: `serve --demo`
died that way when its demo seeding (read, then write) met the nightly sync of the embedded worker."""
from __future__ import annotations

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
