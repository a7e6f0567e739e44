"""Client secret rotation with zero downtime (spec: "Client secret rotation"), end to end.

The service (pytest-tornado) and the example partner app share one IOLoop on two loopback
ports. A background task keeps launching the whole time, as the hub would: sandbox launch ->
the app's launch endpoint -> authorize -> the app's token endpoint (which exchanges the code with
its secrets) -> the platform verifies the access token. The operator steps run through the real
CLI in child processes while launches keep flowing.
"""
from __future__ import annotations

import asyncio
import json
import sys

import pytest

from helpers.environment import ROOT
from helpers.partner_app import PARTNER_SETTINGS, LaunchTraffic
from helpers.processes import settings_env
from helpers.rest import partner_headers
from models.application import Application

pytestmark = PARTNER_SETTINGS


async def cli(settings, *args) -> dict:
    """`svc-auth ARGS --json` in a child process, without blocking the IOLoop that serves launches."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cli.__main__", *args, "--json", env=settings_env(settings), cwd=str(ROOT),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return json.loads(out)




async def initialized_and_enabled(api, p, world, traffic) -> None:
    """The first launch moves the installation to Disabled; the app then enables itself (REST)."""
    first = await traffic.one_launch()
    assert first["status"] == 200 and first["verified"], first
    headers = await partner_headers(api, p.app, p.secret)
    status, _, body = await api.call(
        "PUT", f"/v1/applications/{p.app.id}/organizations/{world.org.id}/activation-status",
        {"status": "Enabled"}, headers=headers)
    assert status == 200, body


async def secret_is_valid(api, app, secret) -> bool:
    status, _, _ = await api.call("POST", "/v1/oauth/token", {
        "grant_type": "client_credentials", "client_id": app.client_id, "client_secret": secret})
    assert status in (200, 401)
    return status == 200


async def refused_within_a_second(api, app, secret) -> None:
    """Every process keeps applications in memory; a change made by another process (the CLI)
    reaches it within a second (app_cache): wait for that, and fail if it takes longer."""
    deadline = asyncio.get_running_loop().time() + 1.0
    while await secret_is_valid(api, app, secret):
        assert asyncio.get_running_loop().time() < deadline, "the change did not arrive within 1 s"
        await asyncio.sleep(0.02)


@pytest.mark.gen_test(timeout=120)
async def test_four_rotation_steps_while_launches_keep_flowing(api, partner, world, runtime, settings):
    p = partner()
    old = p.secret
    traffic = LaunchTraffic(api, p, world.physician, runtime)
    await initialized_and_enabled(api, p, world, traffic)
    traffic.start()
    await traffic.during("before")

    # Step 1: the operator generates a fallback; it is not valid yet, the current one still is.
    traffic.phase = "1-generating"  # launches go on while the CLI runs
    new = (await cli(settings, "apps", "secret", "generate-fallback", "--app", p.app.id))["fallback_secret"]
    assert new and new != old
    await traffic.during("1-generated")
    assert not await secret_is_valid(api, p.app, new) and await secret_is_valid(api, p.app, old)

    # Step 2: the app is deployed with both secrets (current first, fallback on a 4xx).
    p.state.use_secrets(old, new)
    await traffic.during("2-app-has-fallback")

    # Step 3: the operator activates the fallback: the old secret stops working (within a second
    # in every process), the app's first try gets 401 and its retry with the fallback succeeds.
    traffic.phase = "3-activating"
    await cli(settings, "apps", "secret", "activate-fallback", "--app", p.app.id)
    await refused_within_a_second(api, p.app, old)
    await traffic.during("3-activated")
    assert not await secret_is_valid(api, p.app, old) and await secret_is_valid(api, p.app, new)
    assert Application.get_by_id(p.app.id).fallback_secret_hash is None

    # Step 4: after stable operation the app promotes the fallback to its current secret.
    p.state.use_secrets(new)
    await traffic.during("4-promoted")
    results = await traffic.stop()

    failed = [r for r in results if r["status"] != 200 or not r["verified"]]
    assert failed == [], failed
    assert len(results) >= 15
    assert {r["phase"] for r in results} >= {"1-generating", "3-activating"}  # launches ran during the CLI
    calls = {phase: {r["token_calls"] for r in traffic.inside(phase)}
             for phase in ("before", "1-generated", "2-app-has-fallback", "3-activated", "4-promoted")}
    assert calls == {"before": {1}, "1-generated": {1}, "2-app-has-fallback": {1},
                     "3-activated": {2},   # 401 with the old secret, then the fallback
                     "4-promoted": {1}}    # the new secret is current: no retry any more
    assert p.state.config.client_secret == new and p.state.config.fallback_secret == ""


@pytest.mark.gen_test(timeout=120)
async def test_activating_before_the_app_knows_the_fallback_breaks_launches(api, partner, world, runtime, settings):
    """The spec's warning: step 3 before step 2 invalidates the only secret the app has."""
    p = partner()
    traffic = LaunchTraffic(api, p, world.physician, runtime)
    await initialized_and_enabled(api, p, world, traffic)
    traffic.start()
    await traffic.during("before")
    traffic.phase = "operator-steps"
    new = (await cli(settings, "apps", "secret", "generate-fallback", "--app", p.app.id))["fallback_secret"]
    await cli(settings, "apps", "secret", "activate-fallback", "--app", p.app.id)
    await refused_within_a_second(api, p.app, p.secret)
    await traffic.during("activated-too-early")
    # Redeploying with the new secret repairs it.
    p.state.use_secrets(new)
    await traffic.during("repaired")
    await traffic.stop()
    assert {r["status"] for r in traffic.inside("before")} == {200}
    broken = traffic.inside("activated-too-early")
    assert {(r["status"], r["body"]["error"]) for r in broken} == {(502, "token_exchange_failed")}
    assert all(not r["verified"] and r["token_calls"] == 1 for r in broken)  # no fallback to retry with
    assert {(r["status"], r["verified"]) for r in traffic.inside("repaired")} == {(200, True)}


RETIRED = ("This client secret was retired by a secret rotation and no longer authenticates; "
           "use the current client secret (the fallback secret that was activated).")


class TokenCalls:
    """Every token-endpoint answer the partner's backend gets, with the secret it sent: its retry
    logic (`PlatformClient._with_secrets`) runs as it is; this only listens."""

    def __init__(self, platform):
        self.answers: list[tuple[str, int, dict]] = []
        send = platform._token

        async def listening(body):
            answer = await send(body)
            self.answers.append((body["client_secret"], answer.status, answer.body or {}))
            return answer
        platform._token = listening


@pytest.mark.parametrize("store", ["memory", "redis"])
@pytest.mark.gen_test(timeout=120)
async def test_the_retired_secret_is_recognised_not_counted_as_a_guess(api, partner, world, runtime, settings,
                                                                       redis_namespace, store):
    """Issue 29, item 3: after activation every exchange of the partner's backend starts with the old
    secret. 200 exchanges: each first try is 401 "retired by rotation", none is a 429, nothing is
    audited as a lock-out. Wrong secrets that were never valid are still throttled."""
    from helpers.environment import REDIS_URL
    from models.audit import AuditEvent
    from ratelimit.failures import build_failure_throttle
    if store == "redis":
        shared = runtime.settings.replace(redis_url=REDIS_URL, redis_namespace=redis_namespace)
        runtime.client_auth_throttle = build_failure_throttle(shared, "client_auth", runtime.failure_policy(),
                                                              lambda: runtime.clock.time(), runtime.hasher)
    p = partner()
    old = p.secret
    traffic = LaunchTraffic(api, p, world.physician, runtime)
    await initialized_and_enabled(api, p, world, traffic)
    new = (await cli(settings, "apps", "secret", "generate-fallback", "--app", p.app.id))["fallback_secret"]
    p.state.use_secrets(old, new)  # step 2: the backend knows both
    await cli(settings, "apps", "secret", "activate-fallback", "--app", p.app.id)  # step 3
    await refused_within_a_second(api, p.app, old)

    calls = TokenCalls(p.state.platform)
    launches = [await traffic.one_launch() for _ in range(10)]  # code exchanges through the app
    grants = [await p.state.platform.client_credentials() for _ in range(190)]
    assert all(r["status"] == 200 and r["verified"] for r in launches), launches
    assert all(g.ok for g in grants), [g.describe() for g in grants if not g.ok][:3]
    first_tries = [(status, body) for secret, status, body in calls.answers if secret == old]
    assert len(first_tries) == 200 and len(calls.answers) == 400
    assert {(s, b.get("error")) for s, b in first_tries} == {(401, "invalid_client")}, \
        sorted({(s, b.get("error")) for s, b in first_tries})
    assert {b["error_description"] for _, b in first_tries} == {RETIRED}
    assert not AuditEvent.select().where(AuditEvent.action == "auth.lockout").exists()

    # Secrets that were never valid are counted as before: 10 answered, then 429.
    async def token(secret):
        return await api.call("POST", "/v1/oauth/token", {
            "grant_type": "client_credentials", "client_id": p.app.client_id, "client_secret": secret})
    statuses = [(await token(f"never-valid-{n}"))[0] for n in range(12)]
    assert statuses == [401] * 10 + [429] * 2
    assert AuditEvent.select().where(AuditEvent.action == "auth.lockout").exists()
    # The retired secret is still told apart while the client is locked, and the new one works.
    status, _, body = await token(old)
    assert (status, body["error_description"]) == (401, RETIRED)
    assert (await token(new))[0] == 200

    # Past the grace period (SVC_RETIRED_SECRET_GRACE, 30 days) the old secret is a wrong secret.
    runtime.clock.advance(runtime.settings.retired_secret_grace + 1)
    status, _, body = await token(old)
    assert (status, body["error_description"]) == (401, "Unknown client or wrong client secret.")


@pytest.mark.parametrize("change", ["smart_scopes", "public"])
def test_a_change_saved_from_a_copy_read_before_an_activation_keeps_the_activation(runtime, world, monkeypatch,
                                                                                  change):
    """Two changes to one app at once (two console sessions): one activates the fallback secret, the
    other saves SMART settings (or makes the app public) from a copy it read before that activation
    committed. The second wrote every column of its copy back: the old secret current again, the new
    one pending again, the audit saying otherwise. Now only the columns it changed are written."""
    import lifecycle.applications as applications
    from lifecycle.applications import set_public, set_smart_scopes
    from oauth.secret_rotation import activate_fallback_secret, generate_fallback_secret, is_current_secret
    new_secret = generate_fallback_secret(runtime, world.app.id)
    stale = Application.get_by_id(world.app.id)  # read by the other change before the activation commits
    activate_fallback_secret(runtime, world.app.id)
    monkeypatch.setattr(applications, "find_application", lambda application_id: stale)
    if change == "smart_scopes":
        set_smart_scopes(runtime, world.app.id, "launch openid fhirUser patient/Patient.rs")
    else:
        set_public(runtime, world.app.id, False)  # already confidential: nothing of its secrets changes
    saved = Application.get_by_id(world.app.id)
    assert is_current_secret(saved, new_secret, runtime.hasher)
    assert not is_current_secret(saved, world.secret, runtime.hasher)
    assert saved.fallback_secret_hash is None
