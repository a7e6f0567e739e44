"""Start-up failures are one line on stderr naming what to fix, a non-zero exit, no traceback.

Each case runs the real `svc-auth` process (issue 14, item 6)."""
import json
import socket
import subprocess
import sys

import pytest

from helpers.environment import ROOT
from helpers.processes import free_port, settings_env


def run_cli(env, *args, timeout=60):
    return subprocess.run([sys.executable, "-m", "cli.__main__", *args], env=env, cwd=str(ROOT),
                          capture_output=True, text=True, timeout=timeout)


def assert_one_line(result, *needles):
    assert result.returncode != 0, result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def env(settings):
    return settings_env(settings)


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["db", "migrate"], ["orgs", "list"], ["worker"]])
def test_unreachable_database_is_one_line(env, command):
    env["SVC_DATABASE_URL"] = f"postgresql://svc:secret-pw@127.0.0.1:{free_port()}/svc"
    if command[0] == "serve":
        command = ["serve", "--port", str(free_port())]
    line = assert_one_line(run_cli(env, *command), "SVC_DATABASE_URL", "Connection refused")
    assert "secret-pw" not in line  # the password never reaches a terminal or a log


def test_missing_postgres_database_is_one_line(env):
    env["SVC_DATABASE_URL"] = "postgresql://postgres@127.0.0.1:5432/svc_auth_no_such_database"
    assert_one_line(run_cli(env, "db", "migrate"), "SVC_DATABASE_URL", "does not exist")


@pytest.mark.parametrize("command", ["serve", "worker", "scheduler"])
def test_unreachable_redis_is_one_line(env, command):
    env["SVC_REDIS_URL"] = f"redis://127.0.0.1:{free_port()}/0"
    args = ["serve", "--port", str(free_port())] if command == "serve" else [command]
    assert_one_line(run_cli(env, *args), "SVC_REDIS_URL", "redis-server")


@pytest.mark.parametrize("processes", ["1", "2"])
@pytest.mark.parametrize("reuse_port", [False, True])
def test_port_in_use_is_one_line(env, processes, reuse_port):
    """Also when the other process listens with SO_REUSEPORT: a socket of ours with SO_REUSEPORT
    (the same user) would join it and share its connections."""
    with socket.socket() as taken:
        if reuse_port:
            taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert_one_line(run_cli(env, "serve", "--port", str(port), "--processes", processes),
                        f"port {port}", "already in use", "--port")


def test_demo_app_port_in_use_is_one_line(env):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert_one_line(run_cli(env, "serve", "--demo", "--port", str(free_port()), "--demo-app-port", str(port)),
                        f"port {port}", "already in use", "APP_PORT")


@pytest.mark.parametrize("variable,value", [("SVC_HMAC_KEY", "short"), ("SVC_ISSUER", "ftp://nope"),
                                            ("SVC_ACCESS_TOKEN_TTL", "soon")])
def test_bad_setting_is_one_line(env, variable, value):
    env[variable] = value
    for command in (["serve", "--port", str(free_port())], ["db", "migrate"]):
        assert_one_line(run_cli(env, *command), variable)


@pytest.mark.parametrize("value, says", [("0", "must be positive"), ("half an hour", "must be a whole number of seconds"),
                                         (str(10 ** 12), "must be at most")])
def test_a_bad_snapshot_build_deadline_is_refused_at_start(env, value, says):
    """SVC_SNAPSHOT_BUILD_DEADLINE bounds one clinic's night: a value that is no positive whole number
    of seconds (or past ten years) stops every process that builds or serves it, in one line."""
    env["SVC_SNAPSHOT_BUILD_DEADLINE"] = value
    for command in (["snapshot", "run", "--json"], ["worker"], ["serve", "--port", str(free_port())]):
        line = assert_one_line(run_cli(env, *command), "SVC_SNAPSHOT_BUILD_DEADLINE", says)
        assert repr(value) in line, line


def test_the_shipped_env_example_is_refused_until_its_key_is_replaced():
    """deploy/env.example copied as it is (without the documented `sed` of SVC_HMAC_KEY) would run
    every host on its public placeholder key: every command refuses it, naming the variable."""
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("SVC_")}
    result = subprocess.run([sys.executable, "-m", "cli.__main__", "--env-file", str(ROOT / "deploy" / "env.example"),
                             "db", "status"], env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "SVC_HMAC_KEY" in assert_one_line(result, "configuration error", "placeholder")


@pytest.mark.parametrize("variable,value", [
    ("SVC_HMAC_KEY", "CHANGE-ME-" + "0" * 40),
    ("SVC_HMAC_KEY_PREVIOUS", "a" * 64 + ",my-change-me-key-of-at-least-32-chars"),
])
def test_a_change_me_key_is_refused_naming_the_variable(env, variable, value):
    env[variable] = value
    for command in (["serve", "--port", str(free_port())], ["db", "status"]):
        result = run_cli(env, *command)
        assert result.returncode == 2, result.stderr
        assert_one_line(result, variable, "change-me")


@pytest.mark.parametrize("variable", ["SVC_HMAC_KEY", "SVC_HMAC_KEY_PREVIOUS", "SVC_CLAIMS_NAMESPACE"])
def test_a_setting_that_is_not_utf8_is_refused_naming_the_variable_not_the_value(env, variable):
    """Bytes in another encoding reach Python as lone surrogates: a key given so ended every command
    with a traceback (UnicodeEncodeError) that printed the key."""
    env[variable] = "s3cr3t-" + "x" * 40 + "\udce9"  # a Latin-1 é after the key
    for command in (["serve", "--port", str(free_port())], ["db", "status"]):
        result = run_cli(env, *command)
        assert result.returncode == 2, result.stderr
        line = assert_one_line(result, variable, "UTF-8")
        assert "s3cr3t" not in line


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e300", str(11 * 366 * 86400), str(-11 * 366 * 86400)])
def test_a_clock_offset_that_is_not_finite_or_beyond_ten_years_is_refused(env, value):
    """SVC_CLOCK_OFFSET is test only, but it was taken anywhere: nan (every comparison of a time
    false), inf or 1e300 (a date overflow in the first token) and centuries."""
    env["SVC_CLOCK_OFFSET"] = value
    for command in (["serve", "--port", str(free_port())], ["db", "status"]):
        result = run_cli(env, *command)
        assert result.returncode == 2, result.stderr
        assert_one_line(result, "SVC_CLOCK_OFFSET", "ten years")


def test_a_moved_clock_is_a_warning_at_start(env):
    env["SVC_CLOCK_OFFSET"] = "3600"
    result = run_cli(env, "db", "status", "--json")
    assert result.returncode in (0, 3), result.stderr
    warnings = [json.loads(line) for line in result.stderr.splitlines() if '"WARNING"' in line]
    assert [w["message"] for w in warnings if "SVC_CLOCK_OFFSET" in w["message"]] \
        == ["SVC_CLOCK_OFFSET is 3600.0 seconds: this process's clock is moved (a test-only setting; unset it in "
            "a deployment)"]
    env["SVC_CLOCK_OFFSET"] = "0"
    assert "SVC_CLOCK_OFFSET" not in run_cli(env, "db", "status", "--json").stderr


@pytest.mark.parametrize("command", [["serve"], ["db", "migrate"]])
def test_a_password_given_as_a_url_parameter_never_reaches_the_line(env, command):
    """libpq and redis-py both take the password as a URL parameter too (`...?password=...`), and
    svc-auth passes it on; the start-up line named the URL with it in clear, for a terminal, a
    ticket or the journal. Left out as the password of `user:password@`."""
    env["SVC_DATABASE_URL"] = f"postgresql://svc@127.0.0.1:{free_port()}/svc?password=secret-pw&sslmode=disable"
    args = ["serve", "--port", str(free_port())] if command == ["serve"] else command
    line = assert_one_line(run_cli(env, *args), "SVC_DATABASE_URL", "Connection refused")
    assert "secret-pw" not in line and "sslmode=disable" in line


def test_a_database_url_may_set_libpq_s_connect_timeout(env):
    """`?connect_timeout=3` is a libpq parameter like `sslmode`: every command died with a TypeError
    traceback (the keyword given twice, the URL's and svc-auth's default)."""
    env["SVC_DATABASE_URL"] = f"postgresql://svc@127.0.0.1:{free_port()}/svc?connect_timeout=3"
    line = assert_one_line(run_cli(env, "db", "migrate"), "SVC_DATABASE_URL", "Connection refused")
    assert "connect_timeout=3" in line


def test_a_redis_password_given_as_a_url_parameter_never_reaches_the_line(env):
    env["SVC_REDIS_URL"] = f"redis://127.0.0.1:{free_port()}/0?password=secret-pw"
    line = assert_one_line(run_cli(env, "serve", "--port", str(free_port())), "SVC_REDIS_URL", "redis-server")
    assert "secret-pw" not in line


@pytest.mark.parametrize("name, url", [("SVC_DATABASE_URL", "mysql://svc:secret-pw@127.0.0.1/svc"),
                                       ("SVC_DATABASE_URL", "postgresq://svc@127.0.0.1/svc?password=secret-pw"),
                                       ("SVC_REDIS_URL", "valkey://:secret-pw@127.0.0.1:6379/0")])
def test_a_url_of_the_wrong_scheme_is_named_without_its_password(env, name, url):
    """A mistyped scheme is refused naming the URL, which came with its password in clear."""
    env[name] = url
    result = run_cli(env, "serve", "--port", str(free_port()))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert name in result.stderr and "127.0.0.1" in result.stderr and "secret-pw" not in result.stderr, result.stderr
