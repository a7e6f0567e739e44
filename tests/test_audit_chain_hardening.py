"""The disclosure chain against tampering that used to crash its verifier, and a prune of every
record (issue 45, items 4 and 5), on both databases: `svc-auth audit verify --json` (a real CLI
process) always answers `{"ok": false, "first_bad", "reason"}` with exit 1 for whatever the table
holds, exits 2 with one line for a bad `--head`, never prints a traceback; and `seq` never repeats."""
from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys

import pytest

from audit.chain import prune, verify
from audit.disclosures import Disclosure, chain_key, record
from helpers.environment import ROOT
from helpers.processes import settings_env
from models.disclosures import DisclosureRecord


def _fill(runtime, count: int) -> None:
    for n in range(count):
        record(runtime, Disclosure(action="read", organization_id="org_h", resource_type="Patient",
                                   request_id=f"r{n}"), "success", 200, [f"pat_{n}"], [f"pat_{n}"])


def _tamper(runtime, sql: str, *params) -> None:
    """What the database owner can do: turn the append-only guard off, write, turn it on."""
    postgres = runtime.settings.database_url.startswith("postgres")
    with runtime.db.atomic():
        if postgres:
            runtime.db.execute_sql('ALTER TABLE "disclosure_record" DISABLE TRIGGER USER')
        runtime.db.execute_sql(sql.replace("?", "%s") if postgres else sql, params)
        if postgres:
            runtime.db.execute_sql('ALTER TABLE "disclosure_record" ENABLE TRIGGER USER')


def _verify(settings, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.__main__", "audit", "verify", *args, "--json"],
                          env=settings_env(settings), cwd=str(ROOT), capture_output=True, text=True, timeout=120)


def _answer(settings, first_bad: int, *words: str) -> dict:
    result = _verify(settings)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    answer = json.loads(result.stdout)
    assert answer["ok"] is False and answer["first_bad"] == first_bad, answer
    assert all(word in answer["reason"] for word in words), answer
    return answer


_INSERT = ('INSERT INTO "disclosure_record" (seq, at, action, outcome, status, organization_id, patients, '
           'resource_type, resource_ids, query, detail, mac) SELECT 4, at, ?, outcome, status, organization_id, '
           'patients, resource_type, resource_ids, query, ?, ? FROM "disclosure_record" WHERE seq = 3')


@pytest.mark.parametrize("column, text", [("patients", "not json"), ("resource_ids", "[1,"), ("detail", "{"),
                                          ("detail", "[" * 100_000 + "]" * 100_000)])
def test_a_field_edited_into_text_that_is_not_json_is_reported(runtime, column, text):
    _fill(runtime, 3)
    _tamper(runtime, f'UPDATE "disclosure_record" SET "{column}" = ? WHERE "seq" = 2', text)
    _answer(runtime.settings, 2, f"its {column} is not JSON")  # nor JSON nested past any depth we write


def test_a_mac_with_a_non_ascii_character_is_reported(runtime):
    _fill(runtime, 3)
    # PostgreSQL's append-only trigger lets an INSERT through: no owner rights needed for this one.
    runtime.db.execute_sql(_INSERT.replace("?", runtime.db.param), ("read", "{}", "é" * 64))
    _answer(runtime.settings, 4, "mac")
    _tamper(runtime, 'UPDATE "disclosure_record" SET "mac" = ? WHERE "seq" = 2', "\u00e9" + "0" * 63)
    _answer(runtime.settings, 2, "mac")


def test_an_inserted_prune_row_whose_detail_is_not_an_object_is_reported(runtime):
    _fill(runtime, 3)
    head = verify(chain_key(runtime))["head"]
    runtime.db.execute_sql(_INSERT.replace("?", runtime.db.param), ("audit.prune", "[1, 2]", head))
    _answer(runtime.settings, 4, "detail is not a JSON object")


def test_an_unparseable_at_is_reported(runtime, backend):
    if backend != "sqlite":
        pytest.skip("PostgreSQL's timestamp column holds only times")
    _fill(runtime, 3)
    _tamper(runtime, 'UPDATE "disclosure_record" SET "at" = ? WHERE "seq" = 2', "yesterday-ish")
    _answer(runtime.settings, 2, "at is not a time")
    _tamper(runtime, 'UPDATE "disclosure_record" SET "at" = ?, "status" = ? WHERE "seq" = 2',
            "2026-01-01 00:00:00", "two hundred")
    _answer(runtime.settings, 2, "status is not an integer")


def test_stored_text_that_is_not_utf8_is_reported(runtime, backend):
    if backend != "sqlite":
        pytest.skip("PostgreSQL refuses text that is not in its encoding")
    _fill(runtime, 3)
    _tamper(runtime, 'UPDATE "disclosure_record" SET "query" = CAST(X\'FFFE00\' AS TEXT) WHERE "seq" = 2')
    _answer(runtime.settings, 2, "seq 2")


@pytest.mark.parametrize("head", ["é" * 64, "xyz", "0" * 63, "G" * 64])
def test_a_bad_head_exits_2_with_one_line(runtime, head):
    _fill(runtime, 1)
    result = _verify(runtime.settings, "--head", head)
    assert result.returncode == 2 and result.stdout == "", result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--head" in lines[0], result.stderr


def test_every_row_of_a_chain_longer_than_a_batch_is_verified(runtime, monkeypatch):
    import audit.chain
    monkeypatch.setattr(audit.chain, "BATCH", 7)
    _fill(runtime, 30)
    result = verify(chain_key(runtime))
    assert result["ok"] and result["records"] == 30
    _tamper(runtime, 'UPDATE "disclosure_record" SET "query" = ? WHERE "seq" = 22', "x=1")
    result = verify(chain_key(runtime))
    assert result["ok"] is False and result["first_bad"] == 22


def test_a_prune_of_every_record_never_restarts_seq(runtime):
    _fill(runtime, 3)
    later = runtime.clock.now() + dt.timedelta(seconds=5)
    result = prune(runtime.db, chain_key(runtime), later, runtime.clock.now, {"actor": "test"})
    assert result == {"removed": 3, "pruned_through": 3}
    rows = list(DisclosureRecord.select().order_by(DisclosureRecord.seq))
    assert [(r.seq, r.action) for r in rows] == [(4, "audit.prune")], [(r.seq, r.detail) for r in rows]
    _fill(runtime, 2)
    assert [r.seq for r in DisclosureRecord.select().order_by(DisclosureRecord.seq)] == [4, 5, 6]
    assert verify(chain_key(runtime)) == {"ok": True, "records": 3, "head": verify(chain_key(runtime))["head"]}
    # and again: everything, the checkpoint included
    later = runtime.clock.now() + dt.timedelta(seconds=5)
    assert prune(runtime.db, chain_key(runtime), later, runtime.clock.now, {"actor": "test"})["removed"] == 3
    assert [r.seq for r in DisclosureRecord.select()] == [7]
    assert verify(chain_key(runtime))["ok"]


def test_a_checkpoint_that_gave_seq_again_is_reported(runtime):
    """What an earlier release's prune of every record left: its checkpoint at seq 1, saying
    `pruned_through: 3`, then seq 2, 3... again."""
    from audit.chain import append
    append(runtime.db, chain_key(runtime), [{"action": "audit.prune", "outcome": "success",
                                             "detail": {"pruned_through": 3, "anchor": "0" * 64}}],
           runtime.clock.now)
    _fill(runtime, 2)
    _answer(runtime.settings, 1, "seq numbers were given twice")


def test_verify_keeps_no_more_in_memory_for_a_longer_chain(runtime, monkeypatch):
    """A chain four times longer costs `verify` no more memory at its peak: it holds one batch."""
    import tracemalloc
    import audit.chain
    from audit.chain import append
    monkeypatch.setattr(audit.chain, "BATCH", 250)
    rows = [{"action": "read", "outcome": "success", "organization_id": "org_m", "patients": [f"pat_{n}"],
             "resource_type": "Patient", "resource_ids": [f"pat_{n}"], "request_id": f"m{n}"} for n in range(500)]

    def peak() -> tuple[int, int]:
        tracemalloc.start()
        try:
            result = verify(chain_key(runtime))
            return result["records"], tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    for _ in range(4):
        append(runtime.db, chain_key(runtime), rows, runtime.clock.now)
    short = peak()
    for _ in range(12):
        append(runtime.db, chain_key(runtime), rows, runtime.clock.now)
    long = peak()
    assert (short[0], long[0]) == (2000, 8000)
    assert long[1] < short[1] * 1.5, (short, long)
