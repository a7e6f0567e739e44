"""The distribution: sdist and wheel carry everything served, and an installed wheel runs.

Builds the sdist and, from it, the wheel (`python -m build --no-isolation`: offline, with this
venv's setuptools), installs the wheel into a fresh venv (not editable; `--no-deps`, the
dependencies come from this venv through a .pth line so nothing is downloaded), then runs the
installed `svc-auth` from a directory outside the repository: the operator CLI sets up a clinic,
a user and an app, and `svc-auth serve --demo` answers discovery, the SDK, the API docs, the hub
page, the example partner app's page and one launch -> authorize -> token flow.

The sandbox steps go through `sandbox_token()` and `open_hub()` so a change to how the sandbox
is entered (sign-in link, SVC_SANDBOX) is one place to adapt.
"""
from __future__ import annotations

import http.cookiejar
import json
import re
import subprocess
import sys
import sysconfig
import tarfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

import pytest

from helpers.environment import ROOT
from helpers.processes import free_port, stop_process, wait_for_port

pytestmark = pytest.mark.slow

SERVED_DIRS = ["static", "sdk/js/dist", "handlers/templates", "examples/partner_app/static",
               "examples/partner_app/templates", "examples/smart_app/static"]
"""Every file under these is served (or rendered) by the service or the demo app."""


def served_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for d in SERVED_DIRS for p in (ROOT / d).rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts)


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory) -> Path:
    """A fresh venv with only the wheel installed; dependencies resolve from this test's venv."""
    path = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    python = path / "bin" / "python"
    (wheel,) = dist.glob("*.whl")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--no-index", str(wheel)], check=True, timeout=300)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    # Plain path lines: this venv's own .pth files (the editable install of the checkout) are not run.
    Path(site, "svc_auth_test_deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    return path


def test_sdist_and_wheel_carry_everything_served(dist):
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    wheel_names = set(zipfile.ZipFile(wheel).namelist())
    with tarfile.open(sdist) as tar:
        prefix = tar.getnames()[0].split("/")[0]
        sdist_names = {name.removeprefix(prefix + "/") for name in tar.getnames()}
    expected = served_files()
    assert "sdk/js/dist/svc-sdk.js" in expected and "handlers/templates/hub.html" in expected
    assert not [f for f in expected if f not in wheel_names], "missing from the wheel"
    assert not [f for f in expected if f not in sdist_names], "missing from the sdist"
    # The top-level layout of the checkout: server.py and the packages beside it, every one of them
    # (a package missing from setup.py's list would only fail at import time on a real install).
    assert {"server.py", "handlers/static.py", "partner_api/openapi.py"} <= wheel_names
    tops = [d for d in ROOT.iterdir() if (d / "__init__.py").is_file() and d.name not in ("tests", "bench")]
    packages = {p.parent.relative_to(ROOT) for top in tops for p in top.rglob("__init__.py")}
    assert len(packages) > 15
    assert not [str(p) for p in sorted(packages) if f"{p}/__init__.py" not in wheel_names], "packages missing"
    assert "deploy/env.example" in sdist_names  # docs/operations.md installs it from the sdist/checkout


class Installed:
    """The installed `svc-auth` of `venv`, run from `cwd` (outside the repository) with `env`."""

    def __init__(self, venv: Path, cwd: Path, port: int, demo_app_port: int):
        self.bin = venv / "bin"
        self.cwd = cwd
        self.url = f"http://127.0.0.1:{port}"
        self.port = port
        self.demo_app_port = demo_app_port
        self.demo_app_url = f"http://127.0.0.1:{demo_app_port}"
        self.env = {"PATH": f"{self.bin}:/usr/bin:/bin", "HOME": str(cwd), "LANG": "C.UTF-8",
                    "SVC_ISSUER": self.url, "SVC_DATABASE_URL": f"sqlite:///{cwd / 'svc.db'}",
                    "SVC_VAR_DIR": str(cwd / "var"), "SVC_KEYS_DIR": str(cwd / "keys"), "SVC_HMAC_KEY": "p" * 32,
                    "SVC_SANDBOX": "on"}

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([str(self.bin / "svc-auth"), *args], cwd=self.cwd, env=self.env,
                                capture_output=True, text=True, timeout=120)
        if check:
            assert result.returncode == 0, f"svc-auth {' '.join(args)}: {result.stderr}{result.stdout}"
        return result

    def json(self, *args: str) -> dict:
        return json.loads(self.cli(*args, "--json").stdout)


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def fetch(url: str, method: str = "GET", body: dict | None = None, headers: dict | None = None,
         opener=None) -> tuple[int, dict, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={
        **({"Content-Type": "application/json"} if body is not None else {}), **(headers or {})})
    opener = opener or urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(request, timeout=20) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def sandbox_token(svc: Installed, user_id: str) -> str:
    """A sandbox access token of `user_id`, as the operator CLI prints it."""
    return svc.cli("sandbox", "token", "--user", user_id).stdout.strip()


def open_hub(svc: Installed, user_id: str) -> tuple[int, str]:
    """The user's hub page: through a sandbox sign-in link where the CLI offers one, else `?user=`."""
    cookies = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    link = svc.cli("sandbox", "signin-link", "--user", user_id, check=False)
    url = link.stdout.strip() if link.returncode == 0 else f"{svc.url}/sandbox/hub?user={user_id}"
    status, _, body = fetch(url, opener=cookies)
    return status, body.decode()


@pytest.fixture(scope="module")
def installed(venv, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("outside-the-repo")
    svc = Installed(venv, cwd, free_port(), free_port())
    located = subprocess.run([str(venv / "bin" / "python"), "-c", "import server, cli; print(server.__file__)"],
                             cwd=cwd, env=svc.env, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(located).is_relative_to(venv), f"server imported from {located}, not the installed wheel"
    # --demo: the example partner app (examples/partner_app's templates and assets) runs too.
    proc = subprocess.Popen([str(svc.bin / "svc-auth"), "serve", "--port", str(svc.port), "--demo",
                             "--demo-app-port", str(svc.demo_app_port)], cwd=cwd, env=svc.env,
                            stdout=open(cwd / "serve.log", "wb"), stderr=subprocess.STDOUT)
    try:
        wait_for_port(svc.port, timeout=60, proc=proc)
        wait_for_port(svc.demo_app_port, timeout=60, proc=proc)
        yield svc
    finally:
        stop_process(proc)


def test_installed_wheel_serves_discovery_sdk_hub_and_a_launch(installed):
    svc = installed
    # Operator set-up with the installed CLI.
    org = svc.json("orgs", "create", "--name", "Wheel Clinic", "--ehr", "sandbox", "--ehr-url", "https://ehr.example/w")
    user = svc.json("users", "create", "--org", org["id"], "--email", "doc@wheel.example", "--given-name", "Wil",
                    "--family-name", "Heel", "--npi", "1234567893")
    app = svc.json("apps", "create", "--name", "Wheel App", "--redirect-uri", "https://wheel-app.example/app",
                   "--launch-url", "https://wheel-app.example/launch", "--user-fields", "email,name")
    svc.json("installs", "create", "--app", app["application_id"], "--org", org["id"])

    # Discovery and keys.
    status, _, body = fetch(f"{svc.url}/.well-known/openid-configuration")
    assert status == 200
    discovery = json.loads(body)
    assert discovery["issuer"].rstrip("/") == svc.url
    status, _, jwks = fetch(discovery["jwks_uri"])
    assert status == 200 and json.loads(jwks)["keys"]

    # The SDK, as built in the repository.
    status, headers, body = fetch(f"{svc.url}/static/sdk/svc-sdk.js")
    assert status == 200 and "javascript" in headers["Content-Type"]
    assert body == (ROOT / "sdk/js/dist/svc-sdk.js").read_bytes()

    # The API docs page and its vendored Swagger UI.
    status, _, body = fetch(f"{svc.url}/v1/docs")
    assert status == 200
    for asset in re.findall(r'(?:src|href)="(/static/[^"]+)"', body.decode()):
        assert fetch(svc.url + asset.replace("&amp;", "&"))[0] == 200, asset

    # The hub page and the assets it links (static_url of the installed static/).
    status, page = open_hub(svc, user["id"])
    assert status == 200 and 'id="app-frame"' in page and "Wheel App" in page
    assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', page)
    assert assets
    for asset in assets:
        assert fetch(svc.url + asset.replace("&amp;", "&"))[0] == 200, asset

    # The demo's example partner app: its page and assets, from the installed package.
    status, _, body = fetch(f"{svc.demo_app_url}/app")
    assert status == 200 and 'id="id-token-claims"' in body.decode()
    for asset in re.findall(r'(?:src|href)="(/static/[^"]+)"', body.decode()):
        assert fetch(svc.demo_app_url + asset.replace("&amp;", "&"))[0] == 200, asset
    # The example SMART app beside it: its pages and the vendored fhirclient they load.
    for page_name in ("launch.html", "index.html"):
        status, _, body = fetch(f"{svc.demo_app_url}/smart/{page_name}")
        assert status == 200, page_name
        for asset in re.findall(r'(?:src|href)="([^":]+)"', body.decode()):
            assert fetch(f"{svc.demo_app_url}/smart/{asset}")[0] == 200, asset

    # One flow: sandbox launch -> authorize -> code -> token.
    token = sandbox_token(svc, user["id"])
    status, _, body = fetch(f"{svc.url}/v1/sandbox/launches", "POST", {"client_id": app["client_id"]},
                           {"Authorization": f"Bearer {token}"})
    assert status == 201, body
    launch_id = json.loads(body)["launch_id"]
    query = urllib.parse.urlencode({"client_id": app["client_id"], "redirect_uri": "https://wheel-app.example/app",
                                    "launch_id": launch_id, "response_type": "code", "state": "s1"})
    status, headers, body = fetch(f"{svc.url}/v1/oauth/authorize?{query}")
    assert status == 302, body
    location = urllib.parse.urlsplit(headers["Location"])
    params = urllib.parse.parse_qs(location.query)
    assert location.netloc == "wheel-app.example" and params["state"] == ["s1"]
    status, headers, body = fetch(discovery["token_endpoint"], "POST", {
        "grant_type": "authorization_code", "code": params["code"][0], "client_id": app["client_id"],
        "client_secret": app["client_secret"]})
    assert status == 200, body
    tokens = json.loads(body)
    from jose import jwt
    claims = jwt.decode(tokens["id_token"], json.loads(jwks), audience=app["client_id"], issuer=svc.url + "/",
                        options={"verify_at_hash": False})
    assert claims["sub"] == user["id"] and claims["email"] == "doc@wheel.example"
