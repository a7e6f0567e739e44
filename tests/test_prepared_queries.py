"""The hot-path queries with cached SQL (models.prepared) return exactly what plain Peewee returns."""
from __future__ import annotations

import pytest

from models.application import Application
from models.directory import Organization, User
from models.prepared import PreparedQuery


def data(obj) -> dict:
    return dict(obj.__data__)


def test_application_lookups_match_peewee(runtime, world):
    app = world.app
    expected = data(Application.get(Application.id == app.id))
    assert data(Application.by_client_id(app.client_id)) == expected
    assert data(Application.by_id(app.id)) == expected
    assert Application.by_client_id(app.client_id).allowed_origins == app.allowed_origins  # JSON decoded
    # Twice: the second call runs the cached SQL text.
    assert data(Application.by_client_id(app.client_id)) == expected
    for missing in ("cli_unknown", "", None, 42, "' OR 1=1 --"):
        assert Application.by_client_id(missing) is None
        assert Application.by_id(missing) is None


def test_user_with_organization(runtime, world):
    user = User.with_organization(world.physician.id)
    assert data(user) == data(User.get_by_id(world.physician.id))
    assert data(user.organization) == data(Organization.get_by_id(world.org.id))
    assert User.with_organization("usr_nobody") is None


def test_each_argument_must_appear_once(runtime):
    query = PreparedQuery(lambda a, b: Application.select().where(Application.id == a), Application.id, Application.name)
    with pytest.raises(ValueError):
        query.first("x", "y")


def test_migration_1401_adds_auth_time_and_scope_to_an_older_schema(runtime):
    """A database made before issue 14 (no auth_time/scope columns) gains them on migrate."""
    import peewee
    from playhouse.migrate import PostgresqlMigrator, SqliteMigrator, migrate as run
    from models.grants import AuthorizationCode, Launch
    from models.schema import SchemaVersion
    db = runtime.db
    migrator = SqliteMigrator(db) if isinstance(db, peewee.SqliteDatabase) else PostgresqlMigrator(db)
    run(migrator.drop_column("launch", "auth_time"), migrator.drop_column("authorization_code", "auth_time"),
        migrator.drop_column("authorization_code", "scope"))
    SchemaVersion.delete().where(SchemaVersion.version == 1401).execute()
    assert "migration 1401" in " ".join(runtime.migrate())
    assert {"auth_time"} <= {c.name for c in db.get_columns(Launch._meta.table_name)}
    assert {"auth_time", "scope"} <= {c.name for c in db.get_columns(AuthorizationCode._meta.table_name)}
