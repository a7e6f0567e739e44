"""The keyed hash chain of `disclosure_record`: append under one lock, verify, prune with an anchor.

Each row's `mac` is HMAC-SHA-256, under a key derived from SVC_HMAC_KEY, of the previous row's
`mac` and the row's own fields (its `seq` included). Whoever edits the database cannot recompute
it without the key, so `verify` finds an edited field, a deleted or inserted row, and, given a
head seen earlier, a truncated tail. Links are made under the current SVC_HMAC_KEY; `verify` also
accepts SVC_HMAC_KEY_PREVIOUS's, and a reseal checkpoint (`svc-auth keys rekey`) lets the current
key vouch for what they made, so they can be retired (`_Walk`). Appends are serialized (a transaction-level advisory lock on
PostgreSQL, the IMMEDIATE write lock on SQLite), so the chain stays linear with many processes
and `seq` is contiguous: the head is read and the next row written under the same lock.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
from types import MappingProxyType

import orjson
import peewee

from models.disclosures import CHECKPOINT, DisclosureRecord

KEY_LABEL = b"svc-auth disclosure chain v1"
GENESIS = "0" * 64
ADVISORY_LOCK_ID = 2_701_027_001
"""pg_advisory_xact_lock key of the chain (any constant other parts of svc-auth do not use)."""
MAINTENANCE_SETTING = "svc_auth.disclosure_maintenance"
BATCH = 2000

CHAINED = ("seq", "at", "action", "outcome", "status", "organization_id", "application_id", "client_id", "user_id",
           "patients", "resource_type", "resource_ids", "query", "jti", "scope", "source_address", "request_id",
           "detail")


def iso_ms(value: dt.datetime) -> str:
    """ISO 8601 UTC with milliseconds (`2026-11-25T14:05:57.123Z`): how records show their time
    (its fields as they are: an offset, if any, is dropped, not applied)."""
    if value.tzinfo is not None:
        value = value.replace(tzinfo=None)
    return value.isoformat(timespec="milliseconds") + "Z"


def to_ms(value: dt.datetime) -> dt.datetime:
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


_ENCODE = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode
"""The canonical JSON of a record (one encoder: `json.dumps` with options builds one per call)."""


def _canonical(fields: dict) -> bytes:
    """The record's canonical JSON: `_ENCODE`'s UTF-8 bytes, which must never change. A record
    without `detail` (every request's) holds only strings, integers, None and lists of strings:
    orjson with sorted keys gives the same bytes for those (the same escapes for every code point,
    the same integers: `tests/test_disclosure_audit.py` checks each), a tenth of the time. `detail`
    may hold anything (a float, whose text the two spell differently), so the encoder does it."""
    values = {name: fields.get(name) for name in CHAINED}
    values["at"] = iso_ms(values["at"])
    if not values["detail"]:
        try:
            return orjson.dumps(values, option=orjson.OPT_SORT_KEYS)
        except TypeError:
            pass  # what orjson refuses (an integer past 64 bits, a lone surrogate): the encoder decides
    return _ENCODE(values).encode("utf-8")


def link(key: bytes, previous: str, fields: dict) -> str:
    """The `mac` of a row with `fields` after a row whose `mac` is `previous`."""
    return hmac.digest(key, previous.encode("ascii") + b"\n" + _canonical(fields), "sha256").hex()


def _is_postgres(db) -> bool:
    return not isinstance(db, peewee.SqliteDatabase)


def _lock(db) -> None:
    """Serialize appends until this transaction ends (SQLite: its IMMEDIATE transaction already does)."""
    if _is_postgres(db):
        db.execute_sql("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK_ID,))


_COLUMNS = (*CHAINED, "mac")
_HEAD = 'SELECT "seq", "mac" FROM "disclosure_record" ORDER BY "seq" DESC LIMIT 1'


def _head(db) -> tuple[int, str] | None:
    """(seq, mac) of the last record (plain SQL: this runs once per batch of every request)."""
    return db.execute_sql(_HEAD).fetchone()


_AS_IS = MappingProxyType({peewee.CharField: str, peewee.TextField: str, peewee.IntegerField: int,
                          peewee.BigIntegerField: int})
"""Field classes whose conversion gives back a value of this exact type, and None, unchanged."""
_TO_DB = tuple((column, field.db_value, _AS_IS.get(type(field)))
               for column in _COLUMNS for field in (DisclosureRecord._meta.fields[column],))
"""Each column's conversion to its database value (the model's own field's), and the type whose
values it would give back unchanged (not called for them: 19 columns per record)."""


def _insert_sql(db, rows: list[dict]) -> tuple[str, list]:
    """One multi-row INSERT (plain SQL, values converted by the model's own fields)."""
    columns = ", ".join(f'"{c}"' for c in _COLUMNS)
    one = "(" + ", ".join([db.param] * len(_COLUMNS)) + ")"
    params = [value if value is None or type(value) is as_is else to_db(value)
              for row in rows for column, to_db, as_is in _TO_DB for value in (row[column],)]
    return f'INSERT INTO "disclosure_record" ({columns}) VALUES {", ".join([one] * len(rows))}', params


def _linked(key: bytes, head: tuple[int, str] | None, rows: list[dict], at: dt.datetime) -> list[dict]:
    """`rows` (field dicts without seq, at, mac) numbered and linked after `head`."""
    seq, previous = head or (0, GENESIS)
    records = []
    for fields in rows:
        seq += 1
        values = {**dict.fromkeys(CHAINED), "patients": [], "resource_ids": [], "query": "", "resource_type": "",
                  "detail": {}, **fields, "seq": seq, "at": at}
        values["mac"] = previous = link(key, previous, values)
        records.append(values)
    return records


def append(db, key: bytes, rows: list[dict], now) -> list[int]:
    """Append `rows` (field dicts without seq, at, mac) in one transaction; their seqs. `now()` is
    read under the lock, so `at` never goes backwards along the chain (within one clock). Inside a
    caller's transaction, the rows are part of it."""
    if _is_postgres(db) and not db.in_transaction():
        return _append_postgres(db, key, rows, now)
    with db.atomic():
        _lock(db)
        records = _linked(key, _head(db), rows, to_ms(now()))
        db.execute_sql(*_insert_sql(db, records))
    return [r["seq"] for r in records]


def _append_postgres(db, key: bytes, rows: list[dict], now) -> list[int]:
    """`append` on PostgreSQL in two round trips instead of five: `BEGIN`, the lock and the head
    in one, the INSERT and `COMMIT` in the other (Peewee's manual-commit block: it sends nothing
    of its own). A failure rolls back before it goes up."""
    db.ensure_connection()  # a connection found dead is replaced before anything is sent on it
    with db.manual_commit():
        try:
            head = db.execute_sql(f"BEGIN; SELECT pg_advisory_xact_lock(%s); {_HEAD}", (ADVISORY_LOCK_ID,)).fetchone()
            records = _linked(key, head, rows, to_ms(now()))
            sql, params = _insert_sql(db, records)
            db.execute_sql(f"{sql}; COMMIT", params)
        except BaseException:
            _roll_back(db)
            raise
    return [r["seq"] for r in records]


def _roll_back(db) -> None:
    try:
        if not db.is_closed():
            db.execute_sql("ROLLBACK")
    except peewee.PeeweeException:
        pass  # the connection failed: it is discarded by whoever catches the error (Runtime.unit_of_work)


def _fields(row: DisclosureRecord) -> dict:
    return {name: getattr(row, name) for name in CHAINED}


def _anchor(first_seq: int) -> str | None:
    """The `mac` before `first_seq`: GENESIS at the start, else what the prune checkpoint that
    removed the rows before it recorded (trusted only once the walk verifies that checkpoint)."""
    if first_seq == 1:
        return GENESIS
    for checkpoint in (DisclosureRecord.select().where(DisclosureRecord.action == CHECKPOINT)
                       .order_by(DisclosureRecord.seq.desc())):
        detail = checkpoint.detail or {}
        if detail.get("pruned_through") == first_seq - 1 and isinstance(detail.get("anchor"), str):
            return detail["anchor"]
    return None


def _keys(keys) -> list[bytes]:
    """One key (bytes) or the keys in order of preference: the current key's first."""
    return [keys] if isinstance(keys, (bytes, bytearray)) else list(keys)


def _is_reseal(detail) -> bool:
    return isinstance(detail, dict) and isinstance(detail.get("resealed_through"), int)


class _Walk:
    """The chain walked in seq order under several keys (SVC_HMAC_KEY's, then the previous ones').

    A link is accepted under any key not yet closed. A reseal checkpoint (`keys rekey`), linked
    under key j, commits to a SHA-256 digest of every record before it that key j does not verify:
    it vouches for them once the key that made them is retired, and closes every earlier key
    (after it, a link under a retired key is refused, even if that key leaked). A record no key
    verifies is an error unless a later reseal checkpoint vouches for it."""

    def __init__(self, keys, head: str | None):
        self.keys = _keys(keys)
        self.head, self.seen_head = head, head is None
        self.previous, self.expected = None, None
        self.first = self.last = 0
        self.count = 0
        self.digests = [hashlib.sha256() for _ in self.keys]  # digests[i]: records key i does not verify
        self.unvouched: list[int] = []  # seqs no available key verifies and no checkpoint vouched for yet
        self.old = 0  # records only a previous key verifies, not yet vouched for by a reseal checkpoint
        self.seen: set[int] = set()
        self.closed: set[int] = set()
        self.failure: dict | None = None

    def _fail(self, seq, reason) -> None:
        if self.unvouched and (seq is None or self.unvouched[0] < seq):
            seq, reason = self.unvouched[0], _bad_link(self.unvouched[0])
        self.failure = {"ok": False, "first_bad": seq, "reason": reason}

    def feed(self, row) -> bool:
        """Take the next row; False once the chain is known not to verify (see `failure`)."""
        if self.previous is None:
            self.previous, self.first = _anchor(row.seq), row.seq
            if self.previous is None:
                self._fail(row.seq, f"the chain starts at seq {row.seq}, and no prune checkpoint accounts for "
                                    "the records before it: they were deleted")
                return False
        elif row.seq != self.expected:
            self._fail(row.seq, f"seq {self.expected} to {row.seq - 1} are missing: records were deleted")
            return False
        fields = _fields(row)
        mac = row.mac or ""
        by = next((i for i, key in enumerate(self.keys)
                   if i not in self.closed and hmac.compare_digest(link(key, self.previous, fields), mac)), None)
        if by is None:
            self.unvouched.append(row.seq)
        else:
            self.seen.add(by)
            if by:
                self.old += 1
            if row.action == CHECKPOINT and _is_reseal(row.detail) and not self._vouch(row, by):
                return False
        data = _canonical(fields) + b"\n" + mac.encode("ascii", "replace")
        for i, digest in enumerate(self.digests):
            if i != by:
                digest.update(data)
        self.previous, self.expected, self.last = mac, row.seq + 1, row.seq
        self.count += 1
        self.seen_head = self.seen_head or hmac.compare_digest(mac, self.head)
        return True

    def _vouch(self, row, by: int) -> bool:
        """A reseal checkpoint linked under key `by`: check what it commits to, then close older keys."""
        detail = row.detail
        if detail.get("resealed_from") != self.first:
            return True  # records it vouched for were pruned since; a later checkpoint accounts for the rest
        if detail.get("resealed_through") != row.seq - 1 or detail.get("digest") != self.digests[by].hexdigest():
            first = self.unvouched[0] if self.unvouched else row.seq
            self.failure = {"ok": False, "first_bad": first,
                            "reason": f"the records before seq {row.seq} do not match what its reseal checkpoint "
                                      f"(`keys rekey`) vouches for: a record from seq {first} on was edited, inserted "
                                      "or deleted"}
            return False
        self.unvouched, self.old = [], 0
        self.closed |= self.seen - {by}
        return True

    def result(self) -> dict:
        if self.failure:
            return self.failure
        if self.unvouched:
            self._fail(None, "")
            return self.failure
        if not self.seen_head:
            return {"ok": False, "first_bad": None,
                    "reason": f"the head {self.head} is not in the chain: records after seq {self.last} were removed "
                              "(a truncated tail), or the head was not of this chain"}
        return {"ok": True, "records": self.count, "head": self.previous or GENESIS}


def _bad_link(seq: int) -> str:
    return (f"the link of seq {seq} does not verify: this record was edited or inserted, "
            "or the one before it was deleted or edited")


def _rows_after(last: int):
    """The rows after seq `last`, in seq order, read in batches."""
    while True:
        rows = list(DisclosureRecord.select().where(DisclosureRecord.seq > last)
                    .order_by(DisclosureRecord.seq).limit(BATCH))
        if not rows:
            return
        yield from rows
        last = rows[-1].seq


def _walk(walk: _Walk) -> _Walk:
    for row in _rows_after(walk.last):
        if not walk.feed(row):
            break
    return walk


def verify(keys, head: str | None = None) -> dict:
    """Walk the chain in seq order: `{"ok": True, "records", "head"}`, or `{"ok": False,
    "first_bad", "reason"}` naming the first seq whose link fails (None when only the tail is missing).
    `keys`: the chain key, or the keys to try in order (the current key's, then the previous ones')."""
    return _walk(_Walk(keys, head)).result()


def reseal(db, keys, now, checkpoint: dict) -> dict:
    """Let the current key (`keys[0]`) vouch for the records only a previous key verifies (`keys
    rekey`): when there are any, append a reseal checkpoint committing to them. The chain is walked
    without the lock, then its last records under it. `{"resealed": N, "still_old": M, "ok", ...}`:
    with a chain that does not verify, nothing is appended (M counts what the walk found)."""
    keys = _keys(keys)
    walk = _walk(_Walk(keys, None))
    if walk.failure:
        return {**walk.failure, "resealed": 0, "still_old": walk.old + len(walk.unvouched)}
    with db.atomic():
        _lock(db)
        _walk(walk)
        result = walk.result()
        if not result["ok"]:
            return {**result, "resealed": 0, "still_old": walk.old + len(walk.unvouched)}
        old = walk.old
        if old:
            detail = {**checkpoint, "resealed_from": walk.first, "resealed_through": walk.last,
                      "digest": walk.digests[0].hexdigest(), "vouches_for": old}
            append(db, keys[0], [{"action": CHECKPOINT, "outcome": "success", "detail": detail}], now)
    return {"ok": True, "resealed": old, "still_old": 0}


def _unsplit(through: int) -> int:
    """`through` moved back so a prune never removes part of what a reseal checkpoint vouches for
    (the rest could no longer be checked once the old key is retired): all of it goes at once."""
    for row in (DisclosureRecord.select().where(DisclosureRecord.action == CHECKPOINT)
                .order_by(DisclosureRecord.seq.desc())):
        detail = row.detail or {}
        if _is_reseal(detail) and isinstance(detail.get("resealed_from"), int):
            if detail["resealed_from"] <= through < detail["resealed_through"]:
                return detail["resealed_from"] - 1
    return through


def prune(db, key: bytes, before: dt.datetime, now, checkpoint: dict) -> dict:
    """Delete the records older than `before` (a prefix of the chain), then append a checkpoint
    that records the `mac` of the last one removed, so the rest still verifies. PostgreSQL: the
    trigger lets the DELETE through only inside this transaction."""
    with db.atomic():
        _lock(db)
        keep = (DisclosureRecord.select(DisclosureRecord.seq).where(DisclosureRecord.at >= before)
                .order_by(DisclosureRecord.seq).limit(1).first())
        head = _head(db)
        through = _unsplit((keep.seq - 1) if keep else (head[0] if head else 0))
        first = DisclosureRecord.select(peewee.fn.MIN(DisclosureRecord.seq)).scalar() or 0
        removed = 0
        if through >= first > 0:
            anchor = DisclosureRecord.get(DisclosureRecord.seq == through).mac
            if _is_postgres(db):
                db.execute_sql(f"SET LOCAL {MAINTENANCE_SETTING} = 'on'")
            removed = DisclosureRecord.delete().where(DisclosureRecord.seq <= through).execute()
            if _is_postgres(db):
                db.execute_sql(f"SET LOCAL {MAINTENANCE_SETTING} = 'off'")
            detail = {**checkpoint, "before": iso_ms(before), "pruned_through": through, "anchor": anchor,
                      "removed": removed}
            append(db, key, [{"action": CHECKPOINT, "outcome": "success", "detail": detail}], now)
    return {"removed": removed, "pruned_through": through if removed else None}
