"""docs/operations.md runs as written: its Debian install block, executed in a scratch root.

Every line of the block runs, with absolute paths moved under a scratch directory and these
stand-ins for what only a real host can do (each says why):
- `apt-get install`, `useradd`: system-wide; the packages are checked to exist by name instead,
  and the current user plays `svc-auth`.
- `python3 -m venv ... && pip install .`: the wheel install is the packaging smoke test's job
  (a fresh venv costs minutes); here the test's own installed venv is linked in its place.
- `runuser -u postgres -- psql`: runs as `psql -U postgres` on the test server, with a unique
  role and database name.
- `systemctl`, `nginx -t`: no init system in a test; instead each systemd unit's `ExecStart`
  runs with its `EnvironmentFile` and `WorkingDirectory`, and `serve` must answer /readyz.
"""
import grp
import os
import re
import secrets
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psycopg2
import pytest

from conf import read_env_file
from helpers.environment import PG_DSN, REDIS_URL, ROOT
from helpers.processes import free_port, wait_for_port

DOC = ROOT / "docs" / "operations.md"
SYSTEM_PATHS = ["/etc/svc-auth", "/opt/svc-auth", "/var/lib/svc-auth", "/etc/systemd/system", "/etc/nginx"]


def install_block() -> list[str]:
    text = DOC.read_text()
    section = text.split("### Install (Debian)", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def in_root(text: str, root: Path) -> str:
    for path in SYSTEM_PATHS:
        text = text.replace(path, f"{root}{path}")
    return text


def translate(line: str, root: Path, db_name: str, group: str) -> str | None:
    """The scratch-root version of one documented line (None: skipped, see the module doc)."""
    if line.startswith(("apt-get ", "useradd ", "systemctl ")):
        return None
    if line.startswith("python3 -m venv "):
        assert "pip install" in line
        return f"mkdir -p {root}/opt/svc-auth && ln -s {shlex.quote(sys.prefix)} {root}/opt/svc-auth/.venv"
    line = line.replace("runuser -u svc-auth -- ", "")
    if "runuser -u postgres -- psql" in line:
        line = line.replace("runuser -u postgres -- psql", f"psql {PG_DSN}/postgres")
    if line.startswith(("runuser -u postgres", "psql", "sed -i")) or "psql " in line:
        line = line.replace("svc_auth", db_name)
    if "sed -i" in line and "SVC_DATABASE_URL" in line:
        # the test server listens where PG_DSN says (the doc's URL assumes the local default)
        host = PG_DSN.split("@", 1)[1]
        line = line.replace("127.0.0.1:5432", host)
    line = line.replace("-g svc-auth", f"-g {group}")
    parts = [p for p in line.split(" && ") if not p.startswith(("systemctl ", "nginx "))]
    return in_root(" && ".join(parts), root)


@pytest.fixture
def scratch(tmp_path):
    root = tmp_path / "root"
    for path in ("/var/lib/svc-auth", "/etc/systemd/system", "/etc/nginx/sites-available", "/etc/nginx/sites-enabled"):
        Path(f"{root}{path}").mkdir(parents=True)  # what useradd and the Debian packages create
    db_name = f"svc_auth_doc_{secrets.token_hex(4)}"
    yield root, db_name
    admin = psycopg2.connect(PG_DSN + "/postgres")
    admin.autocommit = True
    admin.cursor().execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
    admin.cursor().execute(f'DROP ROLE IF EXISTS "{db_name}"')
    admin.close()


def unit_command(unit: str, root: Path, port: int | None = None) -> tuple[list[str], dict, str]:
    """ExecStart, environment and working directory of an installed systemd unit."""
    text = (Path(f"{root}/etc/systemd/system") / unit).read_text()
    fields = dict(re.findall(r"^(ExecStart|EnvironmentFile|WorkingDirectory)=(.*)$", text, re.M))
    command = in_root(fields["ExecStart"].replace("%i", str(port or "")), root)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SVC_")}
    env.update(read_env_file(Path(in_root(fields["EnvironmentFile"], root))))
    return shlex.split(command), env, in_root(fields["WorkingDirectory"], root)


def test_debian_packages_named_exist():
    names = [line for line in install_block() if line.startswith("apt-get install")][0].split()[2:]
    names = [n for n in names if not n.startswith("-")]
    assert "python3-venv" in names  # `python3 -m venv` needs it on Debian
    if subprocess.run(["apt-cache", "policy", "bash"], capture_output=True, text=True).returncode != 0:
        pytest.skip("apt-cache is not available here")
    for name in names:
        out = subprocess.run(["apt-cache", "show", name], capture_output=True, text=True)
        if out.returncode != 0 and "No packages found" in out.stderr and name != "bash":
            pytest.skip("apt lists not downloaded (run apt-get update)")
        assert out.returncode == 0, f"no Debian package {name!r}: {out.stderr}"


def test_install_block_runs_and_the_units_start(scratch):
    root, db_name = scratch
    group = grp.getgrgid(os.getgid()).gr_name
    lines = []
    for line in install_block():
        translated = translate(line, root, db_name, group)
        if translated is not None:
            lines.append(translated)
        if line.startswith("install -m 0640") and "/etc/svc-auth/env" in line:
            # the shipped file names system paths: move them into the scratch root too, and keep
            # this test's Redis keys apart from other tests'
            env_file = f"{root}/etc/svc-auth/env"
            lines.append(f"sed -i 's|/var/lib/svc-auth|{root}/var/lib/svc-auth|' {env_file}")
            lines.append(f"echo SVC_REDIS_URL={REDIS_URL} >> {env_file}")
            lines.append(f"echo SVC_REDIS_NAMESPACE=doc-{db_name} >> {env_file}")
    script = "set -euo pipefail\n" + "\n".join(lines) + "\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SVC_")}
    result = subprocess.run(["bash", "-c", script], cwd=str(ROOT), env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"{script}\n---\n{result.stdout}\n{result.stderr}"
    assert "created table" in result.stdout  # db migrate ran against the new database

    env_file = read_env_file(Path(f"{root}/etc/svc-auth/env"))
    assert re.fullmatch(r"[0-9a-f]{64}", env_file["SVC_HMAC_KEY"])  # generated, not the shipped placeholder
    assert db_name in env_file["SVC_DATABASE_URL"]
    assert (Path(f"{root}/etc/nginx/sites-enabled/svc-auth")).resolve().is_file()
    assert oct(Path(f"{root}/etc/svc-auth/env").stat().st_mode & 0o777) == "0o640"

    # The working directory is the service user's to write: a `.env` there must change nothing (the
    # units name /etc/svc-auth/env with --env-file, which replaces the ./.env read).
    Path(f"{root}/var/lib/svc-auth/.env").write_text("SVC_SANDBOX=on\n")
    for unit in ("svc-auth-serve@.service", "svc-auth-worker.service", "svc-auth-scheduler.service",
                 "svc-auth-hl7.service"):
        assert "--env-file /etc/svc-auth/env " in (ROOT / "deploy" / "systemd" / unit).read_text(), unit

    # systemctl enable --now svc-auth.target: every unit it wants starts with its configuration
    port = free_port()
    args, unit_env, cwd = unit_command("svc-auth-serve@.service", root, port)
    procs = [subprocess.Popen(args, env=unit_env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)]
    for unit in ("svc-auth-worker.service", "svc-auth-scheduler.service"):
        args, unit_env, cwd = unit_command(unit, root)
        procs.append(subprocess.Popen(args, env=unit_env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    try:
        wait_for_port(port, proc=procs[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=10) as response:
            assert response.status == 200
        launch = urllib.request.Request(f"http://127.0.0.1:{port}/v1/sandbox/launches", data=b"{}", method="POST",
                                        headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(launch, timeout=10)
        assert refused.value.code == 404  # the sandbox stays off: ./.env was not read
        time.sleep(1)
        for proc in procs:
            assert proc.poll() is None, proc.stdout.read().decode()
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert [p.returncode for p in procs] == [0, 0, 0]
