"""The hot-path queries with cached SQL (models.prepared) return exactly what plain Peewee returns."""
from __future__ import annotations

import pytest

from models.application import Application, Installation
from models.clock import Clock
from models.directory import Organization, User
from models.grants import AuthorizationCode, IssuedToken, expiry
from models.prepared import PreparedQuery


def data(obj) -> dict:
    return dict(obj.__data__)


def test_application_lookups_match_peewee(runtime, world):
    app = world["app"]
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
    user = User.with_organization(world["physician"].id)
    assert data(user) == data(User.get_by_id(world["physician"].id))
    assert data(user.organization) == data(Organization.get_by_id(world["org"].id))
    assert User.with_organization("usr_nobody") is None


def _code(world, code_hash: str, organization=None) -> AuthorizationCode:
    return AuthorizationCode.create(
        code_hash=code_hash, application=world["app"].id, user=world["physician"].id,
        organization=organization or world["org"].id, redirect_uri=world["app"].redirect_uri,
        nonce="n-1", expires_at=expiry(Clock().now(), 60))


def test_code_for_exchange_reads_user_and_installation(runtime, world):
    _code(world, "hash-installed")
    grant = AuthorizationCode.find_for_exchange("hash-installed")
    assert data(grant) == data(AuthorizationCode.get_by_id("hash-installed"))
    assert data(grant.user) == data(User.get_by_id(world["physician"].id))
    assert data(grant.installation) == data(Installation.find(world["app"].id, world["org"].id))
    assert AuthorizationCode.find_for_exchange("hash-unknown") is None


def test_code_for_exchange_without_installation(runtime, world):
    other = Organization.create(name="Elsewhere")
    _code(world, "hash-uninstalled", organization=other.id)
    grant = AuthorizationCode.find_for_exchange("hash-uninstalled")
    assert grant.installation is None
    # A code made without the joined read looks its installation up when asked.
    assert data(AuthorizationCode.get_by_id("hash-uninstalled")).keys() == data(grant).keys()
    assert AuthorizationCode.get_by_id("hash-uninstalled").installation is None


def test_consume_is_single_use(runtime, world, clock):
    grant = _code(world, "hash-consume")
    assert grant.consume(clock.now()) is True
    assert grant.consume(clock.now()) is False
    assert AuthorizationCode.get_by_id("hash-consume").used_at is not None


def test_record_writes_the_row_create_would(runtime, world, clock):
    values = dict(kind="access", application=world["app"].id, user=world["physician"].id,
                  code_hash="h", expires_at=expiry(clock.now(), 300))
    IssuedToken.record(jti="jti-recorded", **values)
    IssuedToken.create(jti="jti-created", **values)
    recorded, created = IssuedToken.get_by_id("jti-recorded"), IssuedToken.get_by_id("jti-created")
    assert {k: v for k, v in data(recorded).items() if k not in ("jti", "issued_at")} == \
        {k: v for k, v in data(created).items() if k not in ("jti", "issued_at")}
    assert abs((recorded.issued_at - clock.now()).total_seconds()) < 5  # the default was applied
    assert IssuedToken.is_active("jti-recorded", clock.now())
    IssuedToken.record(jti="jti-client", kind="client", application=world["app"].id, expires_at=expiry(clock.now(), 300))
    assert IssuedToken.get_by_id("jti-client").user_id is None
    with pytest.raises(TypeError):
        IssuedToken.record(jti="x", kind="client", application=world["app"].id, expires_at=expiry(clock.now(), 1), bogus=1)
    assert not IssuedToken.is_active("jti-unknown", clock.now())


def test_each_argument_must_appear_once(runtime):
    query = PreparedQuery(lambda a, b: Application.select().where(Application.id == a), Application.id, Application.name)
    with pytest.raises(ValueError):
        query.first("x", "y")
