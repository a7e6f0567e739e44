"""Every state change writes an audit record (who, what, when) that `svc-auth audit list` shows:
activation status (the platform's first one and the app's own), client secret generated and
activated, signing key rotated. The changes are made through their real interfaces (REST, the
platform verification over HTTP, the CLI)."""
import json
import subprocess
import sys

import pytest

from helpers.environment import ROOT
from helpers.processes import settings_env
from helpers.rest import partner_headers
from hub.sandbox import issue_sandbox_token
from models.audit import AuditEvent
from models.clock import utc_iso


pytestmark = pytest.mark.svc_settings(own_keys=True)  # this module rotates keys


def cli(settings, *args):
    result = subprocess.run([sys.executable, "-m", "cli.__main__", *args], env=settings_env(settings),
                            cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def audit_list(settings, *args) -> list[dict]:
    return json.loads(cli(settings, "audit", "list", "--json", *args))["events"]


@pytest.mark.gen_test
async def test_every_state_change_is_listed_by_the_cli(api, flow, world, settings, runtime):
    app, org = world.app, world.org
    subject = f"{app.id}/{org.id}"
    # The platform verifies the first token: (none) -> Disabled, by the platform.
    tokens = await flow.tokens()
    hub = {"Authorization": f"Bearer {issue_sandbox_token(runtime, world.physician)}"}
    for _ in range(2):  # verified twice: the transition happens (and is audited) once
        status, _, body = await api.call("POST", "/v1/oauth/introspect", {"token": tokens["access_token"]},
                                         headers=hub)
        assert status == 200 and body["active"] is True
    # The app enables itself through the REST API.
    headers = await partner_headers(api, app, world.secret)
    status, _, _ = await api.call("PUT", f"/v1/applications/{app.id}/organizations/{org.id}/activation-status",
                                  {"status": "Enabled"}, headers=headers)
    assert status == 200
    runtime.clock.advance(1)
    # Operators rotate the client secret and the signing key with the CLI.
    fallback = json.loads(cli(settings, "apps", "secret", "generate-fallback", "--app", app.id, "--json"))
    assert fallback["fallback_secret"]
    cli(settings, "apps", "secret", "activate-fallback", "--app", app.id)
    rotated = json.loads(cli(settings, "keys", "rotate", "--json"))

    events = audit_list(settings)
    listed = [(e["actor"], e["action"], e["subject"]) for e in reversed(events)]  # oldest first
    assert listed == [
        ("operator", "application.created", app.id),
        ("platform", "installation.activation_status_set", subject),
        (app.id, "installation.activation_status_set", subject),
        ("operator", "application.secret.fallback_generated", app.id),
        ("operator", "application.secret.fallback_activated", app.id),
        ("operator", "keys.rotated", rotated["kid"]),
    ]
    by_action = {(e["actor"], e["action"]): e for e in events}
    assert by_action[("platform", "installation.activation_status_set")]["detail"] == {
        "before": None, "after": "Disabled", "user_id": world.physician.id}
    assert by_action[(app.id, "installation.activation_status_set")]["detail"] == {
        "before": "Disabled", "after": "Enabled"}
    # When: the service clock's time of the change (the CLI runs later, on the real clock).
    enabled_at = AuditEvent.get(AuditEvent.actor == app.id).at
    assert by_action[(app.id, "installation.activation_status_set")]["at"] == utc_iso(enabled_at)
    # No secret ever reaches the audit trail.
    assert world.secret not in json.dumps(events) and fallback["fallback_secret"] not in json.dumps(events)
    # Filter by action; the text form names who, what and the subject on one line each.
    assert [e["subject"] for e in audit_list(settings, "--action", "keys.rotated")] == [rotated["kid"]]
    text = cli(settings, "audit", "list", "--limit", "2").splitlines()
    assert len(text) == 2 and "keys.rotated" in text[0] and "operator" in text[0]
    assert "application.secret.fallback_activated" in text[1]


def test_a_key_rotation_through_the_domain_function_is_audited(runtime):
    from lifecycle.signing_keys import rotate_signing_key
    before = runtime.keyring.active.kid
    key = rotate_signing_key(runtime, actor="ops@example.com")
    event = AuditEvent.get(AuditEvent.action == "keys.rotated")
    assert (event.actor, event.subject, event.detail) == (
        "ops@example.com", key.kid, {"previous_kid": before, "signs_from": key.not_before})
    assert runtime.keyring.active.kid == before  # pre-published first
    runtime.clock.advance(runtime.settings.key_prepublish_seconds)
    assert runtime.keyring.active.kid == key.kid != before
