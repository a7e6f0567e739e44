"""The demo moves and resets: `make demo PORT=... APP_PORT=...` serves, and prints, exactly those
ports; `svc-auth demo seed --reset` returns the demo to its first-launch state."""
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from helpers.environment import ROOT
from helpers.processes import free_port, settings_env

BANNER_END = "client_secret:"


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def fetch(url, method="GET", body=None, headers=None):
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.build_opener(NoRedirect).open(request, timeout=20) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


def demo_env(settings, **extra):
    """The test's database and keys, but the issuer left unset, as a new user's shell has it."""
    env = settings_env(settings, **extra)
    for name in ("SVC_ISSUER", "SVC_PUBLIC_URL", "SVC_CLAIMS_NAMESPACE"):
        if name not in extra:
            env.pop(name, None)
    return env


def run_cli(env, *args, expect=0):
    result = subprocess.run([sys.executable, "-m", "cli.__main__", *args], env=env, cwd=str(ROOT),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == expect, result.stderr + result.stdout
    return result


@pytest.fixture
def sqlite_only(backend):
    if backend != "sqlite":
        pytest.skip("one backend is enough for a process-level demo test")


def test_make_demo_serves_and_prints_the_ports_it_was_given(settings, sqlite_only, tmp_path):
    port, app_port = free_port(), free_port()
    env = demo_env(settings)
    proc = subprocess.Popen(["make", "--no-print-directory", "demo", f"PORT={port}", f"APP_PORT={app_port}"],
                            cwd=str(ROOT), env=env, stdout=subprocess.PIPE, stderr=open(tmp_path / "demo.log", "wb"),
                            text=True, start_new_session=True)
    try:
        banner, deadline = [], time.time() + 300
        while time.time() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            banner.append(line)
            if BANNER_END in line:
                break
        text = "".join(banner)
        assert BANNER_END in text, text + (tmp_path / "demo.log").read_text()
        # Every URL it prints but the issuer in its command for more sign-in links (a setting, not a page).
        urls = [u.rstrip(";,.") for u in re.findall(r"(?<!SVC_ISSUER=)https?://[^\s)]+", text)]
        assert urls
        assert re.search(r"developer console .*: http://127\.0\.0\.1:%d/console/invite/\S+" % port, text), text
        # The SMART example app: a hub sign-in link to open it from, and its launch URL on the app port.
        assert re.search(r"SMART example app .*: http://127\.0\.0\.1:%d/sandbox/signin/\S+ "
                         r"\(launch URL http://127\.0\.0\.1:%d/smart/launch\.html\)" % (port, app_port), text), text
        for url in urls:
            assert urllib.parse.urlsplit(url).port in (port, app_port), url
            status, _, _ = fetch(url)
            # every printed URL is really served (the launch URL alone, without a launch, is a 400)
            assert status in (200, 302) or (status == 400 and url.endswith("/launch")), (url, status)
        assert f"http://127.0.0.1:{port}" in text and f"http://127.0.0.1:{app_port}" in text

        # The README walkthrough, with the ports it was given: launch -> the app -> authorize -> code.
        walk_env = demo_env(settings, SVC_ISSUER=f"http://127.0.0.1:{port}")
        info = json.loads(run_cli(walk_env, "demo", "seed", "--json").stdout)
        status, _, body = fetch(f"http://127.0.0.1:{port}/v1/sandbox/launches", "POST",
                                json.dumps({"client_id": info["client_id"]}).encode(),
                                {"Authorization": f"Bearer {info['sandbox_token']}", "Content-Type": "application/json"})
        assert status == 201, body
        launch_url = json.loads(body)["launch_url"]
        assert launch_url.startswith(f"http://127.0.0.1:{app_port}/launch?")
        query = urllib.parse.urlencode({"response_type": "code", "client_id": info["client_id"],
                                        "redirect_uri": f"http://127.0.0.1:{app_port}/app",
                                        "launch_id": json.loads(body)["launch_id"]})
        status, headers, _ = fetch(f"http://127.0.0.1:{port}/v1/oauth/authorize?{query}")
        assert status == 302 and headers["Location"].startswith(f"http://127.0.0.1:{app_port}/app?code=")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # make and the service it started (their own group)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_serve_demo_with_several_processes_seeds_and_prints_once(settings, sqlite_only, tmp_path):
    """`serve --demo --processes 2`: both workers serve, one seeds and prints the banner, and only
    it serves the example apps (their sign-in state is in its memory)."""
    port, app_port = free_port(), free_port()
    log_path = tmp_path / "serve.log"
    proc = subprocess.Popen([sys.executable, "-m", "cli.__main__", "serve", "--demo", "--processes", "2",
                             "--port", str(port), "--demo-app-port", str(app_port)],
                            cwd=str(ROOT), env=demo_env(settings), stdout=subprocess.PIPE,
                            stderr=open(log_path, "wb"), text=True, start_new_session=True)
    try:
        deadline = time.time() + 300
        while log_path.read_text().count("svc-auth listening on") < 2 and time.time() < deadline:
            assert proc.poll() is None, log_path.read_text()
            time.sleep(0.1)
        assert log_path.read_text().count("svc-auth listening on") == 2, log_path.read_text()
        status, _, _ = fetch(f"http://127.0.0.1:{app_port}/app")
        assert status in (200, 302)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert out.count(BANNER_END) == 1, out
    assert log_path.read_text().count("demo data ready") == 1


def test_the_banners_command_for_more_sign_in_links_works_as_printed(settings, sqlite_only, tmp_path):
    """The banner names the command that makes more sign-in links. Run as printed from a new user's
    second terminal (no SVC_SANDBOX, no SVC_ISSUER: `serve --demo` turns the sandbox on and picks the
    issuer only for itself), it prints a link into this demo, on its port, that signs in."""
    port, app_port = free_port(), free_port()
    env = demo_env(settings)
    env.pop("SVC_SANDBOX")
    proc = subprocess.Popen([sys.executable, "-m", "cli.__main__", "serve", "--demo", "--port", str(port),
                             "--demo-app-port", str(app_port)], cwd=str(ROOT), env=env, stdout=subprocess.PIPE,
                            stderr=open(tmp_path / "serve.log", "wb"), text=True, start_new_session=True)
    try:
        banner, deadline = "", time.time() + 300
        while BANNER_END not in banner and time.time() < deadline:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, (tmp_path / "serve.log").read_text()
            banner += line
        command = re.search(r"`([^`]*sandbox signin-link --user ID)` makes more", banner)
        assert command, banner
        shell_env = dict(env, PATH=f"{os.path.dirname(sys.executable)}{os.pathsep}{env['PATH']}")
        done = subprocess.run(command.group(1).replace("--user ID", "--user usr_demo_physician"), shell=True,
                              env=shell_env, cwd=str(ROOT), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        link = done.stdout.strip()
        assert urllib.parse.urlsplit(link).port == port, link
        status, headers, _ = fetch(link)
        assert status == 302 and headers["Location"].endswith("/sandbox/hub"), (status, dict(headers))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=60)


def test_demo_seed_reset_returns_to_the_first_launch_state(settings, runtime):
    from hub.launches import create_launch
    from lifecycle.verification import record_platform_verification
    from models.application import Application, Authorization, Installation
    from models.directory import User
    from errors import ApiError
    env = demo_env(settings, SVC_ISSUER=settings.issuer)
    first = json.loads(run_cli(env, "demo", "seed", "--app-url", "http://127.0.0.1:9101", "--json").stdout)

    # The first launch completes: the installation becomes Disabled and launches are refused,
    # which is where the README's curl walkthrough would stop with 403 application_disabled.
    physician = User.get_by_id(first["physician_user_id"])
    record_platform_verification(runtime, Application.get_by_id(first["application_id"]), physician)
    assert Installation.get(Installation.application == first["application_id"]).activation_status == "Disabled"
    with pytest.raises(ApiError) as refused:
        create_launch(runtime, physician, first["client_id"])
    assert refused.value.error == "application_disabled"

    again = json.loads(run_cli(env, "demo", "seed", "--reset", "--json").stdout)
    for key in ("organization_id", "physician_user_id", "other_user_id", "application_id", "client_id",
                "client_secret"):
        assert again[key] == first[key], key
    installation = Installation.get(Installation.application == again["application_id"])
    assert installation.activation_status is None and installation.trial_started_at is None
    assert Authorization.select().count() == 0
    assert Application.get_by_id(again["application_id"]).launch_url == "http://127.0.0.1:9101/launch"  # kept
    # The example SMART app: a public client beside it, installed in the demo clinic.
    from cli.demo_seed import DEMO_SMART_APP_ID, DEMO_SMART_CLIENT_ID
    smart = Application.get_by_id(DEMO_SMART_APP_ID)
    assert smart.public and smart.client_id == DEMO_SMART_CLIENT_ID
    assert (smart.launch_url, smart.allowed_origins) == ("http://127.0.0.1:9101/smart/launch.html", ["http://127.0.0.1:9101"])
    assert {"launch", "openid", "fhirUser", "patient/Patient.rs"} <= set(smart.smart_scopes.split())
    assert Installation.get_or_none(Installation.application == smart.id) is not None
    launch, url = create_launch(runtime, User.get_by_id(again["physician_user_id"]), again["client_id"])
    assert url.startswith("http://127.0.0.1:9101/launch?")


def test_demo_seed_follows_the_app_port_only_when_told(settings, runtime):
    from models.application import Application
    env = demo_env(settings, SVC_ISSUER=settings.issuer)
    first = json.loads(run_cli(env, "demo", "seed", "--app-url", "http://127.0.0.1:9201", "--json").stdout)
    run_cli(env, "demo", "seed")  # no --app-url: the registration stays where the demo runs
    assert Application.get_by_id(first["application_id"]).redirect_uri == "http://127.0.0.1:9201/app"
    moved = json.loads(run_cli(env, "demo", "seed", "--app-url", "http://127.0.0.1:9202", "--json").stdout)
    app = Application.get_by_id(moved["application_id"])
    assert app.redirect_uri == "http://127.0.0.1:9202/app" and moved["client_secret"] == first["client_secret"]


def test_the_demo_secret_it_prints_after_an_hmac_key_rotation_authenticates(settings, runtime):
    """`demo seed` derives the demo app's secret from SVC_HMAC_KEY. After a rotation it prints the
    secret derived from the new key, and that secret is the one the app now has: before, the stored
    hash was still the old secret's, so the printed secret (and the example partner app) got 401."""
    from oauth.clients import authenticate_client
    from runtime import Runtime
    env = demo_env(settings, SVC_ISSUER=settings.issuer)
    first = json.loads(run_cli(env, "demo", "seed", "--app-url", "http://127.0.0.1:9101", "--json").stdout)
    new_key = "r" * 40
    rotated_env = dict(env, SVC_HMAC_KEY=new_key, SVC_HMAC_KEY_PREVIOUS=env["SVC_HMAC_KEY"])
    again = json.loads(run_cli(rotated_env, "demo", "seed", "--json").stdout)
    assert again["client_secret"] != first["client_secret"]
    rotated = Runtime(settings.replace(hmac_key=new_key, hmac_key_previous=(env["SVC_HMAC_KEY"],)))
    try:
        app = authenticate_client(rotated, {"client_id": again["client_id"], "client_secret": again["client_secret"]},
                                  None)
        assert app.id == again["application_id"]
    finally:
        rotated.close()


def test_after_a_reset_the_readmes_commands_make_new_links(settings, live):
    """`demo seed --reset` re-creates the demo users and apps, so the banner's one-time links and
    console invitation stop working; the two commands the README gives for new ones work as written."""
    env = demo_env(settings, SVC_ISSUER=live, SVC_PUBLIC_URL=live)
    env.pop("SVC_SANDBOX", None)
    run_cli(env, "demo", "seed", "--json")
    before = run_cli(dict(env, SVC_SANDBOX="on"), "sandbox", "signin-link", "--user", "usr_demo_physician").stdout.strip()
    run_cli(env, "demo", "seed", "--reset", "--json")
    status, headers, _ = fetch(before)
    assert status != 302, (status, dict(headers))   # the README: the banner's links stop working

    readme = (ROOT / "README.md").read_text().split("## One launch, by hand, with curl", 1)[1].split("```sh", 1)[0]
    link_command = re.search(r"`(SVC_SANDBOX=on svc-auth sandbox signin-link [^`]*)`", readme).group(1)
    invite_command = re.search(r"`(svc-auth developers invite [^`]*)`", readme).group(1)
    shell_env = dict(env, PATH=f"{os.path.dirname(sys.executable)}{os.pathsep}{env['PATH']}")
    done = subprocess.run(link_command, shell=True, env=shell_env, cwd=str(ROOT), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    status, headers, _ = fetch(done.stdout.strip())
    assert status == 302 and "/sandbox/hub" in headers["Location"], (status, dict(headers))
    done = subprocess.run(invite_command, shell=True, env=shell_env, cwd=str(ROOT), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    status, _, _ = fetch(json.loads(done.stdout)["invite_url"])
    assert status == 200
