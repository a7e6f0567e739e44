"""A real `svc-auth serve` process for benchmarks, with seeded data and helpers to mint codes."""
from __future__ import annotations

import base64
import http.client
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.instances import free_port  # noqa: F401 - re-exported (bench modules import it from here)

ROOT = Path(__file__).resolve().parent.parent




def basic(client_id: str, secret: str) -> str:
    raw = f"{urllib.parse.quote(client_id)}:{urllib.parse.quote(secret)}".encode()
    return "Basic " + base64.b64encode(raw).decode()


class BenchService:
    """Seeds a clinic, a physician and an installed app, then runs `svc-auth serve` on a free port.

    database_url: SQLite in a temp dir by default (the embedded deployment), or any PostgreSQL URL.
    root: the checkout whose code `serve` runs (another commit's tree, to compare with it; the
    seeding always uses this checkout's code, so both must share the schema).
    """

    def __init__(self, database_url: str | None = None, processes: int = 1, extra_env: dict | None = None,
                 root: Path = ROOT):
        self.root = root
        self.tmp = Path(tempfile.mkdtemp(prefix="svc-bench-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.database_url = database_url or f"sqlite:///{self.tmp / 'svc.db'}"
        self.processes = processes
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SVC_")}
        self.env.update({"SVC_ISSUER": self.url, "SVC_DATABASE_URL": self.database_url,
                         "SVC_VAR_DIR": str(self.tmp / "var"), "SVC_CODE_TTL": "3600",
                         "SVC_LAUNCH_TTL": "3600", "SVC_LOG_LEVEL": "INFO",
                         # Codes are minted through sandbox launches (a testing tool, off by default).
                         "SVC_SANDBOX": "on",
                         # The secret every host shares (secret hashes, sealed signing keys).
                         "SVC_HMAC_KEY": secrets.token_hex(32)})
        # The one SVC_ setting taken from the environment: the HTTP connection being compared
        # (`SVC_HTTP_CONNECTION=tornado python -m bench --only production`, against the default).
        if os.environ.get("SVC_HTTP_CONNECTION"):
            self.env["SVC_HTTP_CONNECTION"] = os.environ["SVC_HTTP_CONNECTION"]
        self.env.update(extra_env or {})
        self.proc = None
        self.log = None

    def seed(self) -> None:
        from conf import Settings
        from runtime import Runtime
        from lifecycle.applications import install_application, register_application
        from lifecycle.organizations import create_organization
        from lifecycle.users import create_user
        from hub.sandbox import issue_sandbox_token
        runtime = Runtime(Settings.from_env(self.env, dotenv=None))
        runtime.migrate()
        org = create_organization("Bench Clinic", "sandbox", "https://ehr.example/bench")
        user = create_user(org.id, f"doc-{os.getpid()}@bench.example", "Bench", "Doctor", "bdoc", "1234567893")
        app, secret = register_application(
            runtime, "Bench App", "https://app.example.com/main", "https://app.example.com/launch",
            billing_plan="paid", user_fields=["email", "name", "ehrUsername", "organization"])
        install_application(app.id, org.id)
        self.client_id, self.secret, self.redirect_uri = app.client_id, secret, app.redirect_uri
        self.application_id, self.organization_id, self.user_id = app.id, org.id, user.id
        self.sandbox_token = issue_sandbox_token(runtime, user)
        self.private_key = runtime.keyring.active.private  # the service's own key object (cryptography)
        runtime.close()

    def start(self) -> "BenchService":
        self.seed()
        return self.start_seeded()

    def start_seeded(self, python_args: list[str] | None = None) -> "BenchService":
        """Start `serve` on data already seeded (`seed()` plus whatever the benchmark added);
        `python_args` go before `-m cli.__main__` (e.g. `-m cProfile -o FILE`)."""
        self.log = open(self.tmp / "serve.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, *(python_args or []), "-m", "cli.__main__", "serve", "--port", str(self.port),
             "--processes", str(self.processes)],
            env=self.env, cwd=str(self.root), stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError((self.tmp / "serve.log").read_text())
                time.sleep(0.05)
        raise TimeoutError("serve did not start")

    def stop_process(self) -> None:
        """Stop `serve` (SIGTERM, drained), keeping the seeded data and the temp dir."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)
        if getattr(self, "log", None):
            self.log.close()
            self.log = None

    def stop(self) -> None:
        self.stop_process()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the serve process has used so far (Linux /proc)."""
        fields = open(f"/proc/{self.proc.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    @property
    def client_auth(self) -> str:
        return basic(self.client_id, self.secret)

    # -- minting through the real endpoints ------------------------------------------------
    def _mint_codes(self, count: int) -> list[str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        codes = []
        body = json.dumps({"client_id": self.client_id})
        for _ in range(count):
            conn.request("POST", "/v1/sandbox/launches", body=body, headers={
                "Authorization": f"Bearer {self.sandbox_token}", "Content-Type": "application/json"})
            response = conn.getresponse()
            launch = json.loads(response.read())
            query = urllib.parse.urlencode({"client_id": self.client_id, "redirect_uri": self.redirect_uri,
                                            "response_type": "code", "launch_id": launch["launch_id"]})
            conn.request("GET", f"/v1/oauth/authorize?{query}")
            response = conn.getresponse()
            response.read()
            location = urllib.parse.urlsplit(response.getheader("Location"))
            codes.append(urllib.parse.parse_qs(location.query)["code"][0])
        conn.close()
        return codes

    def mint_codes(self, count: int, workers: int = 4) -> list[str]:
        """`count` authorization codes, each from a sandbox launch and the real authorize endpoint."""
        share = [count // workers + (1 if i < count % workers else 0) for i in range(workers)]
        with ThreadPoolExecutor(workers) as pool:
            return [code for part in pool.map(self._mint_codes, share) for code in part]

    def client_token(self) -> str:
        """A partner API access token (client credentials) for the seeded application."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request("POST", "/v1/oauth/token", body="grant_type=client_credentials",
                     headers={"Authorization": self.client_auth,
                              "Content-Type": "application/x-www-form-urlencoded"})
        tokens = json.loads(conn.getresponse().read())
        conn.close()
        return tokens["access_token"]

    def get_json(self, path: str, token: str) -> tuple[int, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        body = json.loads(response.read() or b"{}")
        conn.close()
        return response.status, body

    def platform_token(self, scope: str = "openid fhirUser user/*.rs", organization_id: str | None = None,
                       user_id: str | None = None, **extra) -> str:
        """A platform access token for the FHIR API, signed with the service's own keys as a launch's
        token is (the user, the app, the clinic, `scope`), valid for an hour."""
        from conf import Settings
        from oauth.tokens import PLATFORM_AUDIENCE
        from runtime import Runtime
        runtime = Runtime(Settings.from_env(self.env, dotenv=None))
        try:
            token, _ = runtime.tokens.access_token(user_id or self.user_id, PLATFORM_AUDIENCE, 3600, client_id=self.client_id,
                                                   org=organization_id or self.organization_id, scope=scope, **extra)
        finally:
            runtime.close()
        return token

    def user_access_token(self) -> str:
        code = self._mint_codes(1)[0]
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request("POST", "/v1/oauth/token", body=f"grant_type=authorization_code&code={code}",
                     headers={"Authorization": self.client_auth,
                              "Content-Type": "application/x-www-form-urlencoded"})
        tokens = json.loads(conn.getresponse().read())
        conn.close()
        return tokens["access_token"]
