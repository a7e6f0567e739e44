"""The browser tests' Chromium and the demo service they drive (their fixtures, `demo` and `page`, are
conftest.py's)."""
from __future__ import annotations

import subprocess
import sys

from conf import Settings
from helpers.environment import ROOT
from helpers.processes import free_port, settings_env, start_process, wait_for_port
from models.application import Installation
from models.billing import BillableUse
from runtime import Runtime


CHROMIUM = "/usr/bin/chromium"


CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


APP_ID = "demo-application"


TIMEOUT_MS = 20000


class Demo:
    """`svc-auth serve --demo` on free ports, and a way to set the demo installation's status."""

    def __init__(self, tmp, host: str = "127.0.0.1"):
        """`host`: the name the service is reached by (another name than the loopback address needs
        Chromium's `--host-resolver-rules` to map it there)."""
        self.port, self.app_port = free_port(), free_port()
        self.url = f"http://{host}:{self.port}"
        self.app_url = f"http://127.0.0.1:{self.app_port}"
        self.settings = Settings.build(issuer=self.url, database_url=f"sqlite:///{tmp}/svc.db", var_dir=str(tmp / "var"),
                                       keys_dir=str(tmp / "keys"), hmac_key="b" * 32, sandbox=True)
        self.proc = start_process(["serve", "--port", str(self.port), "--demo", "--demo-app-port", str(self.app_port)],
                                  settings_env(self.settings), self.port, log_path=tmp / "serve.log")
        wait_for_port(self.app_port, proc=self.proc)

    def set_status(self, status: str | None, trial_started_at=None) -> None:
        runtime = Runtime(self.settings)
        try:
            (Installation.update(activation_status=status, trial_started_at=trial_started_at)
             .where(Installation.application == APP_ID).execute())
        finally:
            runtime.close()

    def billable_users(self) -> int:
        runtime = Runtime(self.settings)
        try:
            return BillableUse.select().where(BillableUse.application_id == APP_ID).count()
        finally:
            runtime.close()

    def signin(self, user_id: str, app: str | None = None) -> str:
        """A one-time sign-in link from the operator CLI (`svc-auth sandbox signin-link`)."""
        args = ["sandbox", "signin-link", "--user", user_id] + (["--app", app] if app else [])
        result = subprocess.run([sys.executable, "-m", "cli.__main__", *args], env=settings_env(self.settings),
                                cwd=str(ROOT), capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    def status(self) -> str | None:
        runtime = Runtime(self.settings)
        try:
            return Installation.get(Installation.application == APP_ID).activation_status
        finally:
            runtime.close()


def app_frame(page):
    """The app's frame, once the app page has shown its outcome (claims or error)."""
    page.wait_for_selector("#app-frame:not([hidden])", timeout=TIMEOUT_MS)
    page.frame_locator("#app-frame").locator("#id-token-claims:not(:empty), #sdk-error:not(:empty)").first.wait_for(
        timeout=TIMEOUT_MS)
    return page.frame_locator("#app-frame")
