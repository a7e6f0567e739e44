"""The operator CLI, run as a real `svc-auth` process against the configured database."""
import json
import subprocess
import sys

import pytest

from conftest import ROOT, settings_env


@pytest.fixture
def cli(settings):
    env = settings_env(settings)

    def run(*args, expect=0):
        result = subprocess.run([sys.executable, "-m", "cli.__main__", *args], env=env, cwd=str(ROOT),
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == expect, result.stderr + result.stdout
        return result
    return run


def as_json(result):
    return json.loads(result.stdout)


def test_register_and_launch_setup_with_the_cli(cli, runtime):
    org = as_json(cli("orgs", "create", "--name", "North Clinic", "--ehr-url", "https://ehr.example/north", "--json"))
    user = as_json(cli("users", "create", "--org", org["id"], "--email", "Doc@North.example", "--given-name", "Ann",
                       "--family-name", "Lee", "--ehr-username", "alee", "--npi", "1234567893", "--json"))
    assert user["email"] == "doc@north.example" and user["organization_id"] == org["id"]
    app = as_json(cli("apps", "create", "--name", "Notes", "--redirect-uri", "https://notes.example/app",
                      "--launch-url", "https://notes.example/launch", "--billing-plan", "free_trial",
                      "--user-fields", "email,name", "--allowed-origin", "https://hub.example", "--json"))
    assert set(app) >= {"application_id", "client_id", "client_secret"}
    install = as_json(cli("installs", "create", "--app", app["application_id"], "--org", org["id"], "--json"))
    assert install["activation_status"] is None
    token = cli("sandbox", "token", "--user", user["id"]).stdout.strip()
    assert token.count(".") == 2 and "\n" not in token
    from lifecycle.sandbox import sandbox_user
    assert sandbox_user(runtime, token).id == user["id"]


def test_client_secret_rotation_commands(cli, runtime, world):
    from models.application import Application
    app_id = world["app"].id
    fallback = cli("apps", "secret", "generate-fallback", "--app", app_id).stdout.strip()
    app = Application.get_by_id(app_id)
    assert app.has_secret(world["secret"], runtime.hasher) and not app.has_secret(fallback, runtime.hasher)
    cli("apps", "secret", "activate-fallback", "--app", app_id)
    app = Application.get_by_id(app_id)
    assert app.has_secret(fallback, runtime.hasher) and not app.has_secret(world["secret"], runtime.hasher)
    cli("apps", "secret", "activate-fallback", "--app", app_id, expect=2)  # nothing pending any more


def test_demo_seed_is_idempotent(cli):
    first = as_json(cli("demo", "seed", "--json"))
    second = as_json(cli("demo", "seed", "--json"))
    for key in ("organization_id", "physician_user_id", "other_user_id", "application_id", "client_id",
                "client_secret"):
        assert first[key] == second[key], key
    # hub_url is a fresh one-time sign-in link on each run (the hub needs a sandbox session).
    assert first["hub_url"] != second["hub_url"] and "/sandbox/signin/" in first["hub_url"]
    assert set(first) == {"organization_id", "physician_user_id", "other_user_id", "application_id", "client_id",
                          "client_secret", "hub_url", "sandbox_token"}


def test_keys_rotate_and_db_migrate(cli):
    before = as_json(cli("keys", "list", "--json"))
    rotated = as_json(cli("keys", "rotate", "--json"))
    # Published at once, signing only after the pre-publication time (SVC_KEY_PREPUBLISH_SECONDS).
    assert rotated["kid"] != before["active_kid"] and rotated["active_kid"] == before["active_kid"]
    assert {rotated["kid"], before["active_kid"]} <= set(rotated["published"])
    assert [k["kid"] for k in rotated["upcoming"]] == [rotated["kid"]]
    assert "up to date" in cli("db", "migrate").stdout


@pytest.mark.parametrize("args,needle", [
    (["users", "create", "--org", "org_missing", "--email", "a@b.example"], "No organization"),
    (["users", "create", "--org", "x"], "--email"),
    (["apps", "create", "--name", "A", "--redirect-uri", "not-a-url", "--launch-url", "https://a.example/l"], "redirect_uri"),
    (["apps", "create", "--name", "A", "--redirect-uri", "https://a.example", "--launch-url", "https://a.example/l",
      "--billing-plan", "gold"], "billing-plan"),
    (["installs", "create", "--app", "app_missing", "--org", "org_missing"], "No application"),
    (["sandbox", "token", "--user", "usr_missing"], "no user"),
    (["serve", "--port", "0"], "--port"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_arguments_exit_2_with_a_clear_message(cli, args, needle):
    result = cli(*args, expect=2)
    assert needle in result.stderr


def test_duplicate_email_exits_2(cli, world):
    result = cli("users", "create", "--org", world["org"].id, "--email", "doc@example.com", expect=2)
    assert "already exists" in result.stderr


def test_bad_configuration_exits_2(settings):
    env = settings_env(settings, SVC_ISSUER="ftp://nope", SVC_SYNC_WINDOW="25:00-26:00")
    result = subprocess.run([sys.executable, "-m", "cli.__main__", "db", "migrate"], env=env, cwd=str(ROOT),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "SVC_ISSUER" in result.stderr
