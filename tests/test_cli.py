"""The operator CLI, run as a real `svc-auth` process against the configured database."""
import json
import subprocess
import sys

import pytest

from helpers.environment import ROOT
from helpers.processes import settings_env
from models.directory import Organization, User
from oauth.secret_rotation import is_current_secret


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
    from hub.sandbox import sandbox_user
    assert sandbox_user(runtime, token).id == user["id"]


def test_client_secret_rotation_commands(cli, runtime, world):
    from models.application import Application
    app_id = world.app.id
    fallback = cli("apps", "secret", "generate-fallback", "--app", app_id).stdout.strip()
    app = Application.get_by_id(app_id)
    assert is_current_secret(app, world.secret, runtime.hasher) and not is_current_secret(app, fallback, runtime.hasher)
    cli("apps", "secret", "activate-fallback", "--app", app_id)
    app = Application.get_by_id(app_id)
    assert is_current_secret(app, fallback, runtime.hasher) and not is_current_secret(app, world.secret, runtime.hasher)
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
    result = cli("users", "create", "--org", world.org.id, "--email", "doc@example.com", expect=2)
    assert "already exists" in result.stderr


@pytest.mark.parametrize("npi", ["\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669\u0660",  # Arabic-Indic
                                 "\uff11\uff12\uff13\uff14\uff15\uff16\uff17\uff18\uff19\uff10",  # full-width
                                 "1234567893\n", "123456789", "12345678931"])
def test_an_npi_is_ten_ascii_digits_matched_whole(cli, world, npi):
    """`\\d` takes any Unicode digit and `$` a trailing newline: such an NPI was stored, and the FHIR
    connector, which cannot search by it, left the user without a `fhirUser`."""
    created = cli("users", "create", "--org", world.org.id, "--email", "new@example.com", "--npi", npi, expect=2)
    assert "npi must be 10 digits" in created.stderr
    assert User.get_or_none(User.email == "new@example.com") is None
    updated = cli("users", "update", "--user", world.physician.id, "--npi", npi, expect=2)
    assert "npi must be 10 digits" in updated.stderr
    assert User.get_by_id(world.physician.id).npi == world.physician.npi


def test_bad_configuration_exits_2(settings):
    env = settings_env(settings, SVC_ISSUER="ftp://nope", SVC_SYNC_WINDOW="25:00-26:00")
    result = subprocess.run([sys.executable, "-m", "cli.__main__", "db", "migrate"], env=env, cwd=str(ROOT),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "SVC_ISSUER" in result.stderr


# A clinic's time zone (issue 47): the zone of times an HL7 feed or Epic's web service sends without an offset.
def test_time_zone_is_set_shown_and_changed(cli, runtime):
    plain = json.loads(cli("orgs", "create", "--name", "Plain Clinic", "--json").stdout)
    assert plain["time_zone"] == "UTC"
    org = json.loads(cli("orgs", "create", "--name", "Chicago Clinic", "--time-zone", "America/Chicago",
                         "--json").stdout)
    assert org["time_zone"] == "America/Chicago"
    assert json.loads(cli("orgs", "show", "--org", org["id"], "--json").stdout)["time_zone"] == "America/Chicago"
    moved = json.loads(cli("orgs", "update", "--org", org["id"], "--time-zone", "Pacific/Auckland", "--json").stdout)
    assert moved["time_zone"] == "Pacific/Auckland" and moved["name"] == "Chicago Clinic"
    assert Organization.get_by_id(org["id"]).time_zone == "Pacific/Auckland"


@pytest.mark.parametrize("value", ["Mars/Olympus_Mons", "../../etc/passwd", "", "America/Chicago\x01", "x" * 80])
def test_a_bad_time_zone_exits_2_naming_the_flag_and_changes_nothing(cli, runtime, value):
    org = json.loads(cli("orgs", "create", "--name", "Kept Clinic", "--time-zone", "Europe/Paris", "--json").stdout)
    for args in (["orgs", "create", "--name", "Nowhere Clinic"], ["orgs", "update", "--org", org["id"]]):
        result = cli(*args, "--time-zone", value, expect=2)
        assert "--time-zone" in result.stderr and "IANA" in result.stderr and len(result.stderr.splitlines()) == 1
    assert Organization.get_by_id(org["id"]).time_zone == "Europe/Paris"
    assert not Organization.select().where(Organization.name == "Nowhere Clinic").exists()


def test_version(cli):
    from importlib.metadata import version
    assert cli("--version").stdout.strip() == f"svc-auth {version('svc-auth')}"


def test_list_show_update_for_orgs_users_installs(cli, world, runtime):
    org_id, physician = world.org.id, world.physician
    orgs = as_json(cli("orgs", "list", "--json"))
    assert isinstance(orgs, list) and [o["id"] for o in orgs] == [org_id]
    assert "Test Clinic" in cli("orgs", "list").stdout
    shown = as_json(cli("orgs", "show", "--org", org_id, "--json"))
    assert set(shown["users"]) == {physician.id, world.staff.id}
    assert shown["installed_applications"] == [world.app.id]
    updated = as_json(cli("orgs", "update", "--org", org_id, "--name", "Renamed Clinic", "--ehr-url",
                          "https://ehr.example/renamed", "--json"))
    assert updated["name"] == "Renamed Clinic" and updated["ehr_url"] == "https://ehr.example/renamed"
    assert as_json(cli("orgs", "show", "--org", org_id, "--json"))["name"] == "Renamed Clinic"

    users = as_json(cli("users", "list", "--org", org_id, "--json"))
    assert {u["email"] for u in users} == {"doc@example.com", "staff@example.com"}
    user = as_json(cli("users", "update", "--user", physician.id, "--email", "New@Example.com", "--npi", "",
                       "--json"))
    assert user["email"] == "new@example.com" and user["npi"] is None
    assert as_json(cli("users", "show", "--user", physician.id, "--json"))["email"] == "new@example.com"
    assert "already exists" in cli("users", "update", "--user", world.staff.id, "--email", "new@example.com",
                                   expect=2).stderr

    installs = as_json(cli("installs", "list", "--app", world.app.id, "--json"))
    assert installs == [{"application_id": world.app.id, "organization_id": org_id, "activation_status": None,
                         "installed_at": installs[0]["installed_at"], "trial_started_at": None}]
    assert as_json(cli("installs", "list", "--app", "app_other", "--json")) == []
    # The operator follows the same rule as the app: no status before the first SDK initialization.
    assert "first SDK initialization" in cli("installs", "update", "--app", world.app.id, "--org", org_id,
                                             "--status", "Enabled", expect=2).stderr
    from lifecycle.verification import record_platform_verification
    record_platform_verification(runtime, world.app, physician)
    enabled = as_json(cli("installs", "update", "--app", world.app.id, "--org", org_id, "--status", "Enabled",
                          "--json"))
    assert enabled["activation_status"] == "Enabled" and enabled["trial_started_at"]
    from models.audit import AuditEvent
    assert {e.action for e in AuditEvent.select()} >= {"organization.updated", "user.updated",
                                                      "installation.activation_status_set"}


def test_apps_list_show_and_delete_needs_yes(cli, world, runtime):
    app = world.app
    listed = as_json(cli("apps", "list", "--json"))
    assert [a["client_id"] for a in listed] == [app.client_id]
    assert not any("secret" in key and key != "fallback_secret_pending" for key in listed[0])
    shown = as_json(cli("apps", "show", "--app", app.id, "--json"))
    assert shown["redirect_uri"] == app.redirect_uri
    assert shown["installations"] == [{"organization_id": world.org.id, "activation_status": None}]
    assert "no application" in cli("apps", "show", "--app", "app_missing", expect=2).stderr

    refused = cli("apps", "delete", "--app", app.id, expect=2)
    assert "--yes" in refused.stderr
    assert as_json(cli("apps", "list", "--json")) != []
    assert as_json(cli("apps", "delete", "--app", app.id, "--yes", "--json")) == {"application_id": app.id,
                                                                                  "deleted": True}
    assert as_json(cli("apps", "list", "--json")) == []
    assert as_json(cli("installs", "list", "--json")) == []
    assert "no application" in cli("apps", "delete", "--app", app.id, "--yes", expect=2).stderr


def _help(*argv) -> str:
    """`svc-auth ARGV --help`, in process (the real parser; argparse prints and exits)."""
    import contextlib
    import io
    from cli import build_parser
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--help"])
    return out.getvalue()


def _commands(path=()):
    """Every leaf command, found by reading each level's help (sub-commands are listed indented)."""
    import re
    text = _help(*path)
    section = text.split("positional arguments:", 1)[1].split("\n\n", 1)[0] if "positional arguments:" in text else ""
    subs = re.findall(r"^    (\S+)\s", section + "\n", re.M)
    if not subs:
        yield path, text
    for sub in subs:
        yield from _commands(path + (sub,))


def _options_without_help(text: str) -> list[str]:
    lines = text.split("options:", 1)[1].splitlines() if "options:" in text else []
    missing = []
    for i, line in enumerate(lines):
        if not line.startswith("  -") or line.strip().startswith("-h, --help"):
            continue
        has_inline_help = "  " in line.strip()
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if not has_inline_help and not (nxt.startswith(" " * 10) and nxt.strip()):
            missing.append(line.strip())
    return missing


def test_every_option_has_help_text_and_every_command_is_in_the_readme(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    commands = dict(_commands())
    assert {"serve", "worker", "scheduler", "orgs list", "apps delete", "installs update"} <= {
        " ".join(p) for p in commands}
    missing = {" ".join(path): opts for path, text in commands.items() if (opts := _options_without_help(text))}
    assert missing == {}
    readme = (ROOT / "README.md").read_text()
    absent = sorted(" ".join(path) for path in commands if f"svc-auth {' '.join(path)}" not in readme)
    assert absent == []


def test_help_prints_for_every_command(cli):
    out = cli("--help").stdout
    for command in ("serve", "worker", "scheduler", "orgs", "users", "apps", "installs", "snapshot", "billing",
                    "audit", "keys", "db", "demo", "sandbox"):
        assert command in out
    assert "--yes" in cli("apps", "delete", "--help").stdout


def test_env_file_is_read_like_systemds_environment_file(settings, runtime, tmp_path):
    env_file = tmp_path / "env"
    env_file.write_text(f"# comment line, as in deploy/env.example\nSVC_DATABASE_URL={settings.database_url}\n"
                        f"SVC_VAR_DIR={settings.var_dir}\nSVC_KEYS_DIR={settings.keys_dir}\n"
                        f"SVC_HMAC_KEY={settings.hmac_key}\n")
    env = {k: v for k, v in settings_env(settings).items() if not k.startswith("SVC_")}
    run = lambda *args: subprocess.run([sys.executable, "-m", "cli.__main__", *args], env=env, cwd=str(tmp_path),
                                       capture_output=True, text=True, timeout=60)
    result = run("--env-file", str(env_file), "orgs", "create", "--name", "Env Clinic", "--json")
    assert result.returncode == 0, result.stderr
    assert [o["name"] for o in json.loads(run("--env-file", str(env_file), "orgs", "list", "--json").stdout)] \
        == ["Env Clinic"]
    missing = run("--env-file", str(tmp_path / "nope"), "orgs", "list")
    assert missing.returncode == 2 and len(missing.stderr.splitlines()) == 1 and "--env-file" in missing.stderr


# An attacker-minded sweep of the CLI's arguments: out-of-range dates, values wider than their
# PostgreSQL column (SQLite stored them), unbounded numbers and unreadable files each printed a
# traceback (or were stored) instead of one line naming the flag, exit 2, nothing changed.
LONG = "x" * 10000


@pytest.mark.parametrize("args,needle", [
    (["audit", "list", "--from", "9999-12-31T23:59:59-10:00"], "--from"),  # past year 9999 in UTC: OverflowError
    (["audit", "disclosures", "--org", "ORG", "--to", "0001-01-01T00:00:00+10:00"], "--to"),
    (["audit", "prune", "--before", "0001-01-01T00:00:00+10:00"], "--before"),
    (["audit", "disclosures", "--org", LONG], "no organization"),  # PostgreSQL: audit.read's subject too long
    (["orgs", "create", "--name", "Wide Clinic", "--ehr-url", "https://ehr.example/" + LONG], "--ehr-url"),
    (["orgs", "update", "--org", "ORG", "--fhir-client-id", LONG], "--fhir-client-id"),
    (["users", "create", "--org", "ORG", "--email", "wide@example.com", "--given-name", LONG], "--given-name"),
    (["users", "update", "--user", "USER", "--ehr-username", LONG], "--ehr-username"),
    (["snapshot", "run", "--date", "0001-01-01"], "--date"),  # the night's window fell before year 1
    (["scheduler", "--interval", "inf"], "--interval"),  # Event.wait(inf): OverflowError
    (["hl7", "listen", "--host", LONG, "--port", "1"], "--host"),  # the idna codec refused it: UnicodeError
])
def test_out_of_range_arguments_exit_2_naming_the_flag_and_change_nothing(cli, world, runtime, args, needle):
    args = [{"ORG": world.org.id, "USER": world.physician.id}.get(a, a) for a in args]
    before = (Organization.select().count(), User.select().count(), User.get_by_id(world.physician.id).ehr_username,
              Organization.get_by_id(world.org.id).fhir_client_id)
    result = cli(*args, expect=2)
    assert needle in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert len([line for line in result.stderr.splitlines() if '"level"' not in line]) == 1
    assert (Organization.select().count(), User.select().count(), User.get_by_id(world.physician.id).ehr_username,
            Organization.get_by_id(world.org.id).fhir_client_id) == before


@pytest.mark.parametrize("content", [b"SVC_X=caf\xe9\n", b"SVC_X=a\x00b\n"])
def test_an_unreadable_env_file_is_a_configuration_error(settings, tmp_path, content):
    (tmp_path / "env").write_bytes(content)
    env = {k: v for k, v in settings_env(settings).items() if not k.startswith("SVC_")}
    result = subprocess.run([sys.executable, "-m", "cli.__main__", "--env-file", str(tmp_path / "env"), "orgs", "list"],
                            env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1 and "--env-file" in result.stderr, \
        result.stderr


def test_an_unreadable_default_env_file_is_a_configuration_error(settings, tmp_path):
    """The `./.env` read without `--env-file` (here not UTF-8): one line naming it, exit 2 (it was
    a traceback)."""
    (tmp_path / ".env").write_bytes(b"SVC_X=caf\xe9\n")
    env = {k: v for k, v in settings_env(settings).items() if not k.startswith("SVC_")}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run([sys.executable, "-m", "cli.__main__", "orgs", "list"],
                            env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.splitlines() == [
        "svc-auth: configuration error: .env: not UTF-8 text"], result.stderr


def test_a_table_shows_control_characters_a_sender_stored_as_escapes(cli, runtime, world):
    """An HL7 sender's MSH-10 may decode to ESC, CR and LF (`\\X1B\\`, `\\X0D0A\\`) or hold a
    bidirectional override, and is stored as sent; `hl7 messages` printed it raw, so a table could
    clear the operator's screen or show a forged row. The table shows each as an escape; `--json`
    keeps the value as stored."""
    from hl7feed.config import configure_feed
    from hl7feed.store import receive
    configure_feed(world.org.id, "siu", "NORTH_CLINIC", [])
    control = "A\\X0D0A\\2030-03-01 forged  AA\\X1B\\[2J\u202e"  # a raw U+202E too
    message = "\r".join([f"MSH|^~\\&|EPIC|NORTH_CLINIC|SVCAUTH|HUB|20300301090000||SIU^S99^SIU_S12|{control}|P|2.5.1",
                         "SCH||K-1"])
    assert receive(runtime, message.encode(), "127.0.0.1").ack == "AR"  # a trigger not accepted: recorded
    table = cli("hl7", "messages", "--org", world.org.id).stdout
    assert table.count("\n") == 2 and "\x1b" not in table and "\r" not in table and "\u202e" not in table, table
    assert "A\\x0d\\x0a2030-03-01 forged  AA\\x1b[2J\\u202e" in table, table
    stored = json.loads(cli("hl7", "messages", "--org", world.org.id, "--json").stdout)[0]["control_id"]
    assert stored == "A\r\n2030-03-01 forged  AA\x1b[2J\u202e"


def test_values_ending_in_a_newline_are_refused_not_stored(cli, runtime):
    """`$` in a `match` also matches before a final newline: `--ehr 'sandbox\\n'` created a clinic
    whose EHR name no connector knows, and `--rate-limit`-style settings and HL7 names took the same
    path. Each such value is now matched whole: exit 2, nothing created."""
    before = Organization.select().count()
    result = cli("orgs", "create", "--name", "Newline Clinic", "--ehr", "sandbox\n", expect=2)
    assert "ehr" in (result.stderr + result.stdout).lower()
    assert Organization.select().count() == before


def test_allowed_origin_takes_several_origins_after_one_flag_or_repeated(cli, world):
    """CONTRACTS.md writes `[--allowed-origin ORIGIN ...]`: one flag followed by several origins
    (argparse's "one or more") works, as does repeating the flag, for `apps create` and `apps update`."""
    app = as_json(cli("apps", "create", "--name", "Origins", "--redirect-uri", "https://o.example/app",
                      "--launch-url", "https://o.example/launch", "--allowed-origin", "https://a.example",
                      "https://b.example", "--allowed-origin", "https://c.example", "--json"))
    assert app["allowed_origins"] == ["https://a.example", "https://b.example", "https://c.example"]
    updated = as_json(cli("apps", "update", "--app", app["application_id"], "--allowed-origin", "https://d.example",
                          "https://e.example", "--json"))
    assert updated["allowed_origins"] == ["https://d.example", "https://e.example"]
    assert "--allowed-origin" in cli("apps", "update", "--app", app["application_id"], "--allowed-origin",
                                     expect=2).stderr


@pytest.mark.parametrize("argv", [("orgs", "list", "--json"), ("keys", "list", "--json")])
def test_a_reader_that_goes_away_ends_the_command_quietly(settings, world, argv):
    """`svc-auth ... | head`: the reader closes the pipe before the command writes; the command ends
    with one status and no traceback (Python's "Note on SIGPIPE", the signal module's docs)."""
    import os
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte
    try:
        result = subprocess.run([sys.executable, "-m", "cli.__main__", *argv], env=settings_env(settings),
                                cwd=str(ROOT), stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr, result.stderr


@pytest.mark.parametrize("args,flag", [
    (["orgs", "create", "--name", "caf\udce9"], "--name"),  # Latin-1 bytes in a UTF-8 terminal
    (["grants", "list", "--user", "\udcff"], "--user"),
    (["users", "create", "--org", "ORG", "--email", "a@b.example", "--given-name", "\udced\udca0\udc80"], "--given-name"),
])
def test_an_argument_that_is_not_utf8_exits_2_naming_it_and_changes_nothing(cli, world, args, flag):
    """Bytes that are not UTF-8 reach Python as lone surrogates: stored or looked up, they raised
    UnicodeEncodeError, a traceback and exit 1."""
    args = [world.org.id if a == "ORG" else a for a in args]
    before = (Organization.select().count(), User.select().count())
    result = cli(*args, expect=2)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and "UTF-8" in lines[0], result.stderr
    assert (Organization.select().count(), User.select().count()) == before
