"""The US-only rule as client network allowlists: global (SVC_REST_ALLOWED_NETWORKS) and per application."""
from __future__ import annotations


import pytest

from app_cache.applications import TOPIC as APPLICATIONS
from lifecycle.applications import set_rest_allowed_networks
from helpers.rest import partner_headers


@pytest.mark.gen_test
async def test_global_allowlist_and_trusted_proxy(api, world, runtime):
    app = world.app
    headers = await partner_headers(api, app, world.secret)
    path = f"/v1/applications/{app.id}/organizations"
    runtime.settings = runtime.settings.replace(rest_allowed_networks="10.0.0.0/8")
    status, _, body = await api.call("GET", path, headers=headers)
    assert status == 403 and body["error"] == "region_not_allowed"
    status, _, body = await api.call("GET", path)  # refused before authentication too
    assert status == 403 and body["error"] == "region_not_allowed"
    # X-Forwarded-For is ignored unless the peer is a trusted proxy
    status, _, _ = await api.call("GET", path, headers={**headers, "X-Forwarded-For": "10.1.2.3"})
    assert status == 403
    runtime.settings = runtime.settings.replace(trusted_proxies="127.0.0.1/32")
    status, _, _ = await api.call("GET", path, headers={**headers, "X-Forwarded-For": "10.1.2.3"})
    assert status == 200
    status, _, _ = await api.call("GET", path, headers={**headers, "X-Forwarded-For": "10.1.2.3, 192.0.2.9"})
    assert status == 403  # the hop our proxy saw is 192.0.2.9, whatever the client wrote before it


@pytest.mark.gen_test
async def test_per_application_allowlist(api, world, runtime):
    app = world.app
    headers = await partner_headers(api, app, world.secret)
    path = f"/v1/applications/{app.id}/organizations"
    set_rest_allowed_networks(runtime, app.id, ["192.0.2.0/24"])
    status, _, body = await api.call("GET", path, headers=headers)
    assert status == 403 and body["error"] == "region_not_allowed"
    set_rest_allowed_networks(runtime, app.id, ["127.0.0.0/8", "::1/128"])
    status, _, _ = await api.call("GET", path, headers=headers)
    assert status == 200


@pytest.mark.gen_test
async def test_an_allowlist_the_database_holds_unreadable_fails_closed(api, world, runtime):
    """A stored allowlist whose entries cannot be read (an edit of the database) refuses every
    address; it once read as empty, which allows any network."""
    from models.application import Application
    app = world.app
    headers = await partner_headers(api, app, world.secret)
    path = f"/v1/applications/{app.id}/organizations"
    Application.update(rest_allowed_networks=["not a network"]).where(Application.id == app.id).execute()
    runtime.changes.announce(APPLICATIONS)
    status, _, body = await api.call("GET", path, headers=headers)
    assert status == 403 and body["error"] == "region_not_allowed"
    Application.update(rest_allowed_networks=["not a network", "127.0.0.0/8", "::1/128"]).where(
        Application.id == app.id).execute()
    runtime.changes.announce(APPLICATIONS)
    status, _, _ = await api.call("GET", path, headers=headers)
    assert status == 200
