"""Hot queries whose SQL text Peewee builds once per database instead of on every call.

Peewee turns a query's expression tree into SQL text on every execution; on the token endpoint
that was about a quarter of a request's CPU. `PreparedQuery` asks Peewee (public API: the
database's SQL context) for the SQL text once per database, with a marker where each argument
goes, then runs that text with `Database.execute_sql` and each call's values converted by the
fields Peewee would have used. Rows are decoded here from the query's `selected_columns` with each
field's `python_value`: no cursor wrapper, nothing private. `PreparedInsert` is plain
parameterised INSERT text (psycopg2's public `execute_values` for bulk rows on PostgreSQL).
Use it for the few queries on a hot path; everything else stays plain Peewee.
"""
from __future__ import annotations

import threading
import weakref
from typing import Callable

import peewee


class _Argument:
    """Stands in for the i-th argument while Peewee builds the SQL text."""

    def __init__(self, index: int):
        self.index = index
        self.marker = f"\x00svc-argument-{index}\x00"

    def __str__(self) -> str:  # what a text field makes of it
        return self.marker


class _Compiled:
    __slots__ = ("sql", "plan", "columns", "models")

    def __init__(self, sql: str, plan: list, columns: list):
        self.sql, self.plan, self.columns = sql, plan, columns
        # Which models the columns belong to, in order of first appearance (the first is the row's).
        self.models = list(dict.fromkeys(c.model for c in columns if isinstance(c, peewee.Field)))


class PreparedQuery:
    """`build(*arguments)` returns a Peewee query; `fields[i]` converts argument i (its `db_value`).

    `first(*values)` / `all(*values)` return model objects (columns of joined models become
    objects set on the row's attribute named in `attach`), `dicts(*values)` plain dicts keyed by
    column name, `execute(*values)` the affected row count.
    """

    def __init__(self, build: Callable[..., peewee.Query], *fields: peewee.Field, attach: dict | None = None):
        self._build = build
        self._fields = fields
        self._attach = attach or {}
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
        columns = list(query.selected_columns or ()) if isinstance(query, peewee.SelectQuery) else []
        return _Compiled(sql, plan, columns)

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
        db = self._database()
        compiled = self.compiled(db)
        return db, compiled, db.execute_sql(compiled.sql, self.params(compiled, values))

    def _database(self) -> peewee.Database:
        # The database the runtime bound the models to (Database.bind): that of the first model field.
        return next(f.model for f in self._fields if getattr(f, "model", None))._meta.database

    def all(self, *values) -> list:
        _, compiled, cursor = self._run(values)
        return [self._object(compiled, row) for row in cursor.fetchall()]

    def first(self, *values):
        rows = self.all(*values)
        return rows[0] if rows else None

    def dicts(self, *values) -> list[dict]:
        _, compiled, cursor = self._run(values)
        # Keys as Peewee's `.dicts()` names them: a field's name (`provider`, not `provider_id`).
        names = [c.name if isinstance(c, peewee.Field) else d[0] for c, d in zip(compiled.columns, cursor.description)]
        converters = [c.python_value if isinstance(c, peewee.Field) else None for c in compiled.columns]
        return [{name: (convert(value) if convert and value is not None else value)
                 for name, convert, value in zip(names, converters, row)} for row in cursor.fetchall()]

    def execute(self, *values) -> int:
        db, _, cursor = self._run(values)
        return db.rows_affected(cursor)

    def _object(self, compiled: _Compiled, row):
        data: dict = {model: {} for model in compiled.models}
        for column, value in zip(compiled.columns, row):
            data[column.model][column.name] = column.python_value(value) if value is not None else None
        main, *joined = compiled.models
        obj = main(**data[main])
        for model in joined:
            values = data[model]
            related = model(**values) if any(v is not None for v in values.values()) else None
            setattr(obj, self._attach[model], related)
        return obj


class PreparedInsert:
    """Inserts rows of `model` with plain parameterised SQL, every column listed (but an
    auto-increment key, which the database assigns), defaults filled as `Model()` fills them."""

    def __init__(self, model: type[peewee.Model]):
        self._model = model
        self._fields = [f for f in model._meta.sorted_fields if not isinstance(f, peewee.AutoField)]
        columns = ", ".join(f'"{f.column_name}"' for f in self._fields)
        self._head = f'INSERT INTO "{model._meta.table_name}" ({columns}) VALUES '

    def _row(self, values: dict) -> list:
        row = []
        values = dict(values)
        for field in self._fields:
            if field.name in values:
                value = values.pop(field.name)
            else:
                value = field.default() if callable(field.default) else field.default
            row.append(field.db_value(value))
        if values:
            raise TypeError(f"{self._model.__name__} has no field(s) {', '.join(values)}")
        return row

    def _sql(self, db: peewee.Database) -> str:
        return self._head + "(" + ", ".join([db.param] * len(self._fields)) + ")"

    def insert(self, **values) -> None:
        db = self._model._meta.database
        db.execute_sql(self._sql(db), self._row(values))

    def insert_many(self, rows) -> int:
        """Insert every row (dicts of field name -> value): sqlite3's `executemany`, or psycopg2's
        `execute_values` (multi-row VALUES, 500 rows a statement)."""
        db = self._model._meta.database
        params = [self._row(values) for values in rows]
        if not params:
            return 0
        cursor = db.cursor()
        if isinstance(db, peewee.PostgresqlDatabase):
            from psycopg2.extras import execute_values
            execute_values(cursor, self._head + "%s", params, page_size=500)
        else:
            cursor.executemany(self._sql(db), params)
        return len(params)
