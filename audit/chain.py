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
import sqlite3
from types import MappingProxyType, SimpleNamespace

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


def append(db, key: bytes, rows: list[dict], now, after: tuple[int, str] | None = None) -> list[int]:
    """Append `rows` (field dicts without seq, at, mac) in one transaction; their seqs. `now()` is
    read under the lock, so `at` never goes backwards along the chain (within one clock). Inside a
    caller's transaction, the rows are part of it. `after`: the (seq, mac) the chain continues
    from when the table is empty (a prune that removed every record): seq never starts again at 1.
    `rows` may be a function giving them, called once the lock is held (the group commit takes
    what arrived while it waited for another process's append, issue 49)."""
    if _is_postgres(db) and not db.in_transaction() and after is None:
        return _append_postgres(db, key, rows, now)
    with db.atomic():
        _lock(db)
        head = _head(db)
        if after is not None and (head is None or head[0] < after[0]):
            head = after
        records = _linked(key, head, rows() if callable(rows) else rows, to_ms(now()))
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
            records = _linked(key, head, rows() if callable(rows) else rows, to_ms(now()))
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


def _fields(row) -> dict:
    return {name: getattr(row, name) for name in CHAINED}


_JSON_COLUMNS = frozenset(("patients", "resource_ids", "detail"))
_SELECT = "SELECT " + ", ".join(f'"{c}"' for c in _COLUMNS) + ' FROM "disclosure_record"'
_HEX = frozenset("0123456789abcdef")


class Unreadable(ValueError):
    """A stored row holds what svc-auth never writes (text that is not JSON, a time that is not
    one, a number that is not one, bytes where text belongs): `verify` reports it, never raises."""


def is_mac(value) -> bool:
    """A chain `mac` (or head): 64 lowercase hex digits."""
    return isinstance(value, str) and len(value) == 64 and _HEX.issuperset(value)


def _convert(values: tuple) -> SimpleNamespace:
    """A stored row (the raw column values of `_COLUMNS`) as the walk reads it, or Unreadable."""
    row = {}
    for column, value in zip(_COLUMNS, values):
        field = DisclosureRecord._meta.fields[column]
        if value is None:
            row[column] = None
        elif column in _JSON_COLUMNS:
            if not isinstance(value, str):
                raise Unreadable(f"its {column} is not text")
            try:
                row[column] = json.loads(value)
            except (ValueError, RecursionError):
                raise Unreadable(f"its {column} is not JSON svc-auth writes") from None
        elif column == "at":
            at = field.python_value(value)
            if not isinstance(at, dt.datetime):
                raise Unreadable("its at is not a time")
            row[column] = at
        elif isinstance(field, peewee.IntegerField):  # seq, status
            if type(value) is not int:
                raise Unreadable(f"its {column} is not an integer")
            row[column] = value
        else:
            if not isinstance(value, str):
                raise Unreadable(f"its {column} is not text")
            row[column] = value
    if row["detail"] is not None and not isinstance(row["detail"], dict):
        raise Unreadable("its detail is not a JSON object")
    if not is_mac(row["mac"]):
        raise Unreadable("its mac is not a MAC (64 hex digits)")
    return SimpleNamespace(**row)


def _read_batch(db, last: int, limit: int | None = None) -> list:
    """The next rows after seq `last` (at most BATCH): each a row, or `(seq, Unreadable)`. When
    the batch cannot be fetched (SQLite text that is not UTF-8), it is read one row at a time, so
    the row that cannot be read is the one reported."""
    where = f' WHERE "seq" > {db.param} ORDER BY "seq" LIMIT {int(limit or BATCH)}'
    try:
        raw = db.execute_sql(_SELECT + where, (last,)).fetchall()
    except (peewee.PeeweeException, sqlite3.Error, UnicodeDecodeError, ValueError):
        seqs = [r[0] for r in db.execute_sql(f'SELECT "seq" FROM "disclosure_record"{where}', (last,)).fetchall()]
        raw = []
        for seq in seqs:
            try:
                raw.append(db.execute_sql(_SELECT + f' WHERE "seq" = {db.param}', (seq,)).fetchone())
            except (peewee.PeeweeException, sqlite3.Error, UnicodeDecodeError, ValueError):
                raw.append((seq, Unreadable("its stored text cannot be decoded")))
                break
    rows = []
    for values in raw:
        if isinstance(values[1], Unreadable):
            rows.append(values)
            continue
        try:
            rows.append(_convert(values))
        except (Unreadable, ValueError, TypeError, OverflowError, RecursionError) as exc:
            rows.append((values[0], exc if isinstance(exc, Unreadable) else Unreadable(f"it cannot be read ({exc})")))
    return rows


def _checkpoints(db) -> list[tuple[int, dict]]:
    """(seq, detail) of every checkpoint whose detail reads as an object, newest first (they are few)."""
    sql = f'SELECT "seq", "detail" FROM "disclosure_record" WHERE "action" = {db.param} ORDER BY "seq" DESC'
    found = []
    for seq, text in db.execute_sql(sql, (CHECKPOINT,)).fetchall():
        try:
            detail = json.loads(text) if isinstance(text, str) else None
        except (ValueError, RecursionError):
            continue
        if isinstance(detail, dict):
            found.append((seq, detail))
    return found


def _anchor(db, first_seq: int) -> tuple[str, dict] | tuple[None, None]:
    """(the `mac` before `first_seq`, the detail of the checkpoint that recorded it): GENESIS at the
    start, else what the prune checkpoint that removed the rows before it recorded (trusted only
    once the walk verifies that checkpoint)."""
    if first_seq == 1:
        return GENESIS, {}
    try:
        checkpoints = _checkpoints(db)
    except (peewee.PeeweeException, sqlite3.Error, UnicodeDecodeError, ValueError):
        return None, None
    for _, detail in checkpoints:
        if detail.get("pruned_through") == first_seq - 1 and is_mac(detail.get("anchor")):
            return detail["anchor"], detail
    return None, None


def _key_id(key: bytes) -> str:
    """A chain key's public name, as a checkpoint names it: HMAC-SHA-256(key, label), 16 hex digits."""
    return hmac.new(key, b"svc-auth chain key id v1", hashlib.sha256).hexdigest()[:16]


def _closes(detail) -> set[str]:
    """The ids (`_key_id`) of the keys a checkpoint says are closed: a
    reseal checkpoint's, and every later checkpoint's too, so a prune never reopens one."""
    ids = detail.get("closes") if isinstance(detail, dict) else None
    return {i for i in ids if isinstance(i, str)} if isinstance(ids, list) else set()


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
    verifies is an error unless a later reseal checkpoint vouches for it. A row whose stored
    content svc-auth never writes is an error at once. What the walk keeps does not grow with the
    chain (rows are read in batches of BATCH)."""

    def __init__(self, db, keys, head: str | None):
        self.db = db
        self.keys = _keys(keys)
        self.head, self.seen_head = head, head is None
        self.previous, self.expected = None, None
        self.first = self.last = 0
        self.count = 0
        self.digests = [hashlib.sha256() for _ in self.keys]  # digests[i]: records key i does not verify
        self.unvouched_first: int | None = None  # the first seq no key verifies and no checkpoint vouched for
        self.unvouched = 0  # how many such records
        self.old = 0  # records only a previous key verifies, not yet vouched for by a reseal checkpoint
        self.first_by: dict[int, int] = {}  # key index -> the first seq it linked
        self.last_by: int | None = None  # the key index that linked the last row (None: no key did)
        self.seen: set[int] = set()
        self.closed: set[int] = set()
        self.ids = [_key_id(key) for key in self.keys]
        self.failure: dict | None = None

    def _fail(self, seq, reason) -> None:
        if self.unvouched_first is not None and (seq is None or self.unvouched_first < seq):
            seq, reason = self.unvouched_first, _bad_link(self.unvouched_first)
        self.failure = {"ok": False, "first_bad": seq, "reason": reason}

    def feed(self, row) -> bool:
        """Take the next row (or `(seq, Unreadable)`); False once the chain is known not to verify."""
        if isinstance(row, tuple):
            seq, error = row
            self._fail(seq, f"seq {seq} holds what svc-auth never writes: {error}; the record was edited or inserted")
            return False
        try:
            return self._feed(row)
        except (ValueError, TypeError, OverflowError, UnicodeError, AttributeError, RecursionError) as exc:
            self._fail(row.seq, f"seq {row.seq} holds what svc-auth never writes ({exc.__class__.__name__}); "
                                "the record was edited or inserted")
            return False

    def _feed(self, row) -> bool:
        if self.previous is None:
            (self.previous, anchored), self.first = _anchor(self.db, row.seq), row.seq
            self._close(_closes(anchored), None)  # what reseals before the pruned part closed stays closed
            if self.previous is None:
                self._fail(row.seq, f"the chain starts at seq {row.seq}, and no prune checkpoint accounts for "
                                    "the records before it: they were deleted")
                return False
        elif row.seq != self.expected:
            self._fail(row.seq, f"seq {self.expected} to {row.seq - 1} are missing: records were deleted")
            return False
        detail = row.detail
        if (row.action == CHECKPOINT and isinstance(detail, dict) and isinstance(detail.get("pruned_through"), int)
                and detail["pruned_through"] >= row.seq):
            self._fail(row.seq, f"seq {row.seq} is a prune checkpoint of the records through seq "
                                f"{detail['pruned_through']}: seq numbers were given twice (a prune of every "
                                "record restarted seq)")
            return False
        fields = _fields(row)
        mac = row.mac
        by = next((i for i, key in enumerate(self.keys)
                   if i not in self.closed and hmac.compare_digest(link(key, self.previous, fields), mac)), None)
        self.last_by = by
        if by is None:
            self.unvouched += 1
            if self.unvouched_first is None:
                self.unvouched_first = row.seq
        else:
            self.seen.add(by)
            self.first_by.setdefault(by, row.seq)
            if by:
                self.old += 1
            if row.action == CHECKPOINT and _is_reseal(detail) and not self._vouch(row, by):
                return False
            if row.action == CHECKPOINT:
                self._close(_closes(detail), by)
        data = _canonical(fields) + b"\n" + mac.encode("ascii")
        for i, digest in enumerate(self.digests):
            if i != by:
                digest.update(data)
        self.previous, self.expected, self.last = mac, row.seq + 1, row.seq
        self.count += 1
        self.seen_head = self.seen_head or hmac.compare_digest(mac, self.head)
        return True

    def _close(self, ids: set[str], by: int | None) -> None:
        """Close the keys named by `ids` (any but `by`, the key that linked what names them)."""
        self.closed |= {i for i, kid in enumerate(self.ids) if kid in ids and i != by}

    def _vouch(self, row, by: int) -> bool:
        """A reseal checkpoint linked under key `by`: check what it commits to, then close older keys."""
        detail = row.detail
        if detail.get("resealed_from") != self.first:
            return True  # records it vouched for were pruned since; a later checkpoint accounts for the rest
        if detail.get("resealed_through") != row.seq - 1 or detail.get("digest") != self.digests[by].hexdigest():
            first = self.unvouched_first if self.unvouched_first is not None else row.seq
            self.failure = {"ok": False, "first_bad": first,
                            "reason": f"the records before seq {row.seq} do not match what its reseal checkpoint "
                                      f"(`keys rekey`) vouches for: a record from seq {first} on was edited, inserted "
                                      "or deleted"}
            return False
        self.unvouched_first, self.unvouched, self.old = None, 0, 0
        self.closed |= self.seen - {by}
        return True

    def contradiction(self) -> dict | None:
        """Why the current key (index 0) must not vouch for the others now, or None: `cause`
        `keys_in_wrong_order` when a key given as previous started linking after the current one
        did (SVC_HMAC_KEY and SVC_HMAC_KEY_PREVIOUS the wrong way round: a shell or env file at an
        earlier step of the rotation), `old_key_still_linking` when the newest record is linked
        under a previous key after the current key linked (a host still runs on the old key)."""
        current = self.first_by.get(0)
        if current is None:
            return None
        later = sorted((seq, i) for i, seq in self.first_by.items() if i and seq > current)
        if later:
            seq, i = later[0]
            return {"cause": "keys_in_wrong_order",
                    "reason": f"the key given as SVC_HMAC_KEY_PREVIOUS #{i} started linking records at seq {seq}, "
                              f"after SVC_HMAC_KEY did (seq {current}): SVC_HMAC_KEY and SVC_HMAC_KEY_PREVIOUS are "
                              "the wrong way round (this shell or env file is at an earlier step of the rotation); "
                              "run keys rekey with the new key as SVC_HMAC_KEY"}
        if self.last_by:
            return {"cause": "old_key_still_linking",
                    "reason": f"the newest record (seq {self.last}) is linked under SVC_HMAC_KEY_PREVIOUS "
                              f"#{self.last_by}, after SVC_HMAC_KEY linked seq {current}: a host still runs on the "
                              "old key; restart every host with the new SVC_HMAC_KEY, then run keys rekey"}
        return None

    def result(self) -> dict:
        if self.failure:
            return self.failure
        if self.unvouched_first is not None:
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


def _walk(walk: _Walk) -> _Walk:
    """Feed `walk` the rows after its last, in seq order, BATCH at a time."""
    while True:
        rows = _read_batch(walk.db, walk.last)
        if not rows:
            return walk
        for row in rows:
            if not walk.feed(row):
                return walk


def verify(keys, head: str | None = None, db=None) -> dict:
    """Walk the chain in seq order: `{"ok": True, "records", "head"}`, or `{"ok": False,
    "first_bad", "reason"}` naming the first seq whose link fails (None when only the tail is missing).
    `keys`: the chain key, or the keys to try in order (the current key's, then the previous ones').
    Whatever the table holds, this answers (it raises only when the database cannot be read)."""
    if head is not None and not is_mac(head):
        raise ValueError("a head is 64 hex digits, as audit verify printed it")
    return _walk(_Walk(db or DisclosureRecord._meta.database, keys, head)).result()


def early_link(db, keys) -> tuple[int, int | None] | None:
    """(seq, which of `keys` linked it, or None for none) of the chain's second oldest record,
    linked after the oldest: a cheap look at whether the keys given still verify the old part of
    the chain (`serve`'s start). None when there are fewer than two rows or they cannot be read
    (`audit verify` reports those)."""
    rows = _read_batch(db, 0, 2)
    if len(rows) < 2 or any(isinstance(row, tuple) for row in rows):
        return None
    first, second = rows
    if second.seq != first.seq + 1:
        return None
    try:
        fields = _fields(second)
        return second.seq, next((i for i, key in enumerate(_keys(keys))
                                 if hmac.compare_digest(link(key, first.mac, fields), second.mac)), None)
    except (ValueError, TypeError, OverflowError, UnicodeError, RecursionError):
        return None


def under_lock(db, fn, /, *args):
    """`fn(*args)` in one transaction holding the chain's append lock (what `append` and `reseal`
    take): whatever it reads and writes is ordered with every append and every reseal."""
    with db.atomic():
        _lock(db)
        return fn(*args)


def resealed_by(db, keys, look: int = 100) -> tuple[int, int] | None:
    """(seq, which of `keys` linked it) of the newest reseal checkpoint (`keys rekey`) among the
    newest `look` checkpoints, or None: none, its predecessor pruned, unreadable, or linked under a
    key not given. A cheap look (checkpoints are few): a host whose SVC_HMAC_KEY_PREVIOUS linked
    it must not link under its SVC_HMAC_KEY any more (that key was closed)."""
    sql = (f'SELECT "seq", "detail" FROM "disclosure_record" WHERE "action" = {db.param} '
           f'ORDER BY "seq" DESC LIMIT {int(look)}')
    try:
        for seq, text in db.execute_sql(sql, (CHECKPOINT,)).fetchall():
            try:
                detail = json.loads(text) if isinstance(text, str) else None
            except (ValueError, RecursionError):
                continue
            if not _is_reseal(detail):
                continue
            by = _linked_by(db, keys, seq)
            return None if by is None else (seq, by)
    except (peewee.PeeweeException, sqlite3.Error, UnicodeDecodeError, ValueError, TypeError, OverflowError):
        return None
    return None


def _linked_by(db, keys, seq: int) -> int | None:
    """Which of `keys` linked the record `seq` (after its predecessor, or the anchor a prune
    checkpoint recorded for it), or None."""
    rows = {row.seq: row for row in _read_batch(db, seq - 2, 2) if not isinstance(row, tuple)}
    if seq not in rows:
        return None
    previous = rows[seq - 1].mac if seq - 1 in rows else _anchor(db, seq)[0]
    if previous is None:
        return None
    fields = _fields(rows[seq])
    return next((i for i, key in enumerate(_keys(keys))
                 if hmac.compare_digest(link(key, previous, fields), rows[seq].mac)), None)


def closed_by(db, keys) -> tuple[int, int | None] | None:
    """(seq, which of `keys` linked it, or None) of the newest checkpoint that says `keys[0]` is
    closed (`_closes`: a reseal checkpoint, or a prune checkpoint carrying what a pruned one
    said), or None. A host whose SVC_HMAC_KEY was closed must not link under it."""
    current = _key_id(_keys(keys)[0])
    try:
        for seq, detail in _checkpoints(db):
            if current in _closes(detail):
                return seq, _linked_by(db, keys, seq)
    except (peewee.PeeweeException, sqlite3.Error, UnicodeDecodeError, ValueError, TypeError, OverflowError):
        return None
    return None


def check_keys(db, keys) -> dict:
    """What `keys rekey` looks at before it changes anything: the chain walked (no lock). `{"ok",
    "still_old", "refused"?: {"cause", "reason"}}` plus the failure of a chain that does not verify."""
    walk = _walk(_Walk(db, _keys(keys), None))
    result = walk.result()
    out = {**result, "still_old": walk.old + walk.unvouched}
    refused = walk.contradiction() if result["ok"] else None
    if refused:
        out["refused"] = refused
    return out


def reseal(db, keys, now, checkpoint: dict, guard=None) -> dict:
    """Let the current key (`keys[0]`) vouch for the records only a previous key verifies (`keys
    rekey`): when there are any, append a reseal checkpoint committing to them. The chain is walked
    without the lock, then its last records under it. `{"resealed": N, "still_old": M, "ok", ...}`:
    with a chain that does not verify, or keys that contradict it (`refused`, `_Walk.contradiction`,
    or what `guard()` returns under the lock: `keys.holders.hosts_on_old_key`), nothing is appended
    (M counts what the walk found)."""
    keys = _keys(keys)
    walk = _walk(_Walk(db, keys, None))
    if walk.failure:
        return {**walk.failure, "resealed": 0, "still_old": walk.old + walk.unvouched}
    with db.atomic():
        _lock(db)
        _walk(walk)
        result = walk.result()
        if not result["ok"]:
            return {**result, "resealed": 0, "still_old": walk.old + walk.unvouched}
        refused = walk.contradiction() or (guard() if guard else None)
        if refused:
            return {"ok": True, "refused": refused, "resealed": 0, "still_old": walk.old}
        old = walk.old
        if old:
            closes = sorted({walk.ids[i] for i in walk.seen | walk.closed} - {walk.ids[0]})
            detail = {**checkpoint, "resealed_from": walk.first, "resealed_through": walk.last,
                      "digest": walk.digests[0].hexdigest(), "vouches_for": old, "closes": closes}
            append(db, keys[0], [{"action": CHECKPOINT, "outcome": "success", "detail": detail}], now)
    return {"ok": True, "resealed": old, "still_old": 0}


def _unsplit(db, through: int) -> int:
    """`through` moved back so a prune never removes part of what a reseal checkpoint vouches for
    (the rest could no longer be checked once the old key is retired): all of it goes at once."""
    sql = f'SELECT "detail" FROM "disclosure_record" WHERE "action" = {db.param} ORDER BY "seq" DESC'
    for (text,) in db.execute_sql(sql, (CHECKPOINT,)).fetchall():
        try:
            detail = json.loads(text) if isinstance(text, str) else None
        except (ValueError, RecursionError):
            continue
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
        through = _unsplit(db, (keep.seq - 1) if keep else (head[0] if head else 0))
        first = DisclosureRecord.select(peewee.fn.MIN(DisclosureRecord.seq)).scalar() or 0
        removed = 0
        if through >= first > 0:
            anchor = DisclosureRecord.get(DisclosureRecord.seq == through).mac
            # what the removed checkpoints closed, the prune checkpoint says on (`_closes`)
            closes = set().union(*(_closes(detail) for seq, detail in _checkpoints(db) if seq <= through))
            if _is_postgres(db):
                db.execute_sql(f"SET LOCAL {MAINTENANCE_SETTING} = 'on'")
            removed = DisclosureRecord.delete().where(DisclosureRecord.seq <= through).execute()
            if _is_postgres(db):
                db.execute_sql(f"SET LOCAL {MAINTENANCE_SETTING} = 'off'")
            detail = {**checkpoint, "before": iso_ms(before), "pruned_through": through, "anchor": anchor,
                      "removed": removed, "closes": sorted(closes)}
            append(db, key, [{"action": CHECKPOINT, "outcome": "success", "detail": detail}], now,
                   after=(through, anchor))
    return {"removed": removed, "pruned_through": through if removed else None}
