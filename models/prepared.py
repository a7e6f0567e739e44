"""Hot queries whose SQL text Peewee builds once per database instead of on every call.

Peewee turns a query's expression tree into SQL text on every execution; on the token endpoint
that was about a quarter of a request's CPU. `PreparedQuery` asks Peewee for the SQL once per
database, with a marker where each argument goes, then runs that text with each call's values
converted by the same fields Peewee would have used, and reads rows back with the query's own
Peewee cursor wrapper. That wrapper works out, from the cursor's column names, which field and
converter each column has, on every execution; for one SQL text the answer never changes, so it is
kept from the first execution too. Same SQL, same conversions, same model objects; only the
rebuilding is gone.
Use it for the few queries on a hot path; everything else stays plain Peewee.
"""
from __future__ import annotations

import threading
import weakref
from typing import Callable

import peewee

from models.db import database


class _Argument:
    """Stands in for the i-th argument while Peewee builds the SQL text."""

    def __init__(self, index: int):
        self.index = index
        self.marker = f"\x00svc-argument-{index}\x00"

    def __str__(self) -> str:  # what a text field makes of it
        return self.marker


class _Compiled:
    __slots__ = ("query", "sql", "plan", "columns")

    def __init__(self, query, sql: str, plan: list):
        self.query, self.sql, self.plan = query, sql, plan
        self.columns = None  # what the cursor wrapper's initialize() derived, once rows came back


class PreparedQuery:
    """`build(*arguments)` returns a Peewee query; `fields[i]` converts argument i (its `db_value`).

    `first(*values)` / `all(*values)` return model objects, `execute(*values)` the affected row count.
    """

    def __init__(self, build: Callable[..., peewee.Query], *fields: peewee.Field):
        self._build = build
        self._fields = fields
        self._compiled: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def _compile(self, db: peewee.Database) -> _Compiled:
        arguments = [_Argument(i) for i in range(len(self._fields))]
        query = self._build(*arguments)
        sql, params = db.get_sql_context().sql(query).query()
        plan, used = [], []
        for param in params:
            match = next((a for a in arguments if param is a or param == a.marker), None)
            if match is None:
                plan.append((False, param))  # a constant of the query itself (e.g. LIMIT 1)
            else:
                plan.append((True, match.index))
                used.append(match.index)
        if sorted(used) != list(range(len(arguments))):
            raise ValueError(f"each argument must appear exactly once in the query: {sql}")
        return _Compiled(query, sql, plan)

    def compiled(self, db: peewee.Database) -> _Compiled:
        compiled = self._compiled.get(db)
        if compiled is None:
            with self._lock:
                compiled = self._compiled.get(db)
                if compiled is None:
                    compiled = self._compiled[db] = self._compile(db)
        return compiled

    def params(self, compiled: _Compiled, values) -> list:
        converted = [field.db_value(value) for field, value in zip(self._fields, values, strict=True)]
        return [converted[item] if is_argument else item for is_argument, item in compiled.plan]

    def _run(self, values: tuple):
        db = database.obj
        compiled = self.compiled(db)
        return db, compiled, db.execute_sql(compiled.sql, self.params(compiled, values))

    def all(self, *values) -> list:
        _, compiled, cursor = self._run(values)
        wrapper = compiled.query._get_cursor_wrapper(cursor)
        if compiled.columns is not None:
            wrapper.__dict__.update(compiled.columns)
            wrapper.initialized = True
            return list(wrapper.iterator())
        before = set(wrapper.__dict__)
        rows = list(wrapper.iterator())
        if wrapper.initialized:  # initialize() ran on the first row: keep what it derived
            compiled.columns = {k: v for k, v in wrapper.__dict__.items() if k not in before}
        return rows

    def first(self, *values):
        rows = self.all(*values)
        return rows[0] if rows else None

    def execute(self, *values) -> int:
        db, _, cursor = self._run(values)
        return db.rows_affected(cursor)


class PreparedInsert:
    """Inserts rows of `model`, every column listed (but an auto-increment key, which the database
    assigns), defaults filled as `Model()` fills them."""

    def __init__(self, model: type[peewee.Model]):
        self._model = model
        fields = [f for f in model._meta.sorted_fields if not isinstance(f, peewee.AutoField)]
        self._names = [field.name for field in fields]
        self._query = PreparedQuery(
            lambda *arguments: model.insert(dict(zip(fields, arguments))).returning(), *fields)

    def _row(self, values: dict) -> list:
        row = []
        values = dict(values)
        for name in self._names:
            if name in values:
                row.append(values.pop(name))
            else:
                default = self._model._meta.fields[name].default
                row.append(default() if callable(default) else default)
        if values:
            raise TypeError(f"{self._model.__name__} has no field(s) {', '.join(values)}")
        return row

    def insert(self, **values) -> None:
        self._query.execute(*self._row(values))

    def insert_many(self, rows) -> int:
        """Insert every row (dicts of field name -> value) with the one-row SQL text: sqlite3's
        `executemany`, or psycopg2's `execute_values` (multi-row VALUES, 500 rows a statement)."""
        db = database.obj
        compiled = self._query.compiled(db)
        params = [self._query.params(compiled, self._row(values)) for values in rows]
        if not params:
            return 0
        cursor = db.cursor()
        if isinstance(db, peewee.PostgresqlDatabase):
            from psycopg2.extras import execute_values
            head = compiled.sql[:compiled.sql.index(" VALUES ")]
            execute_values(cursor, head + " VALUES %s", params, page_size=500)
        else:
            cursor.executemany(compiled.sql, params)
        return len(params)
