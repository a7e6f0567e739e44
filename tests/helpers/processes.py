"""Child processes of the tests: free ports, the environment of a child `svc-auth`, starting and
stopping it, and waiting (for a port, for a condition)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from bench.instances import free_port  # noqa: F401 - the one allocator, re-exported for the tests
from conf import Settings
from helpers.environment import ROOT




def settings_env(settings: Settings, **extra) -> dict:
    """Environment that makes a child `svc-auth` process read the same settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SVC_")}
    for name in ("issuer", "public_url", "database_url", "redis_url", "s3_endpoint_url", "s3_bucket",
                 "claims_namespace", "redis_namespace", "demo_application_id", "sync_window", "var_dir", "keys_dir",
                 "objects_dir", "hmac_key", "ehr_interactive_deadline", "ehr_interactive_max_bytes",
                 "ehr_interactive_max_pages", "ehr_batch_deadline", "ehr_batch_max_bytes", "ehr_batch_max_pages",
                 "bulk_max_concurrent", "bulk_file_ttl", "bulk_file_max_bytes", "ehr_key_overlap_seconds",
                 "chart_build_deadline", "snapshot_build_deadline"):
        value = getattr(settings, name, None)
        if value:
            env["SVC_" + name.upper()] = str(value)
    env["SVC_SANDBOX"] = "on" if settings.sandbox else "off"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def faulty_env(settings: Settings, organization_id: str) -> dict:
    """`settings_env`, with the fault of `helpers/faults/sitecustomize.py` switched on for one
    organization: its FHIR connector raises an exception no code expects."""
    faults = Path(__file__).resolve().parent / "faults"
    path = os.pathsep.join([str(faults), str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return settings_env(settings, PYTHONPATH=path, SVC_TEST_FAULT_ORGANIZATION=organization_id)


def wait_for_port(port: int, timeout: float = 60.0, proc=None) -> None:
    """Until something accepts on `port`; a `proc` that exits fails at once. The bound is long
    because a Python process's imports can take tens of seconds on a loaded 2-core machine (a
    clean-clone run beside other work missed 20 s once) and costs nothing when it starts."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on port {port}")


def start_process(args: list[str], env: dict, port: int | None = None, log_path: Path | None = None):
    """Start `svc-auth ARGS...` (or another module) and wait until `port` accepts connections."""
    out = open(log_path, "wb") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen([sys.executable, "-m", "cli.__main__", *args] if args and args[0] != "-m" else
                            [sys.executable, *args], env=env, cwd=str(ROOT), stdout=out, stderr=subprocess.STDOUT)
    if port:
        wait_for_port(port, proc=proc)
    return proc


def stop_process(proc, timeout: float = 10.0) -> int:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def children_of(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def wait_until_listening(log_path: Path, processes: int = 1, timeout: float = 60.0) -> None:
    """Until `processes` serve processes logged that they listen. The port accepts connections
    (into the kernel's backlog) before a process has installed its signal handlers and added the
    socket to its server: a SIGTERM in between stops it with nothing in flight."""
    deadline = time.time() + timeout
    while log_path.read_text().count("svc-auth listening on") < processes:
        assert time.time() < deadline, log_path.read_text()[-2000:]
        time.sleep(0.05)


def wait_until(condition, timeout: float = 60.0, what: str = "condition"):
    """Poll `condition()` every 0.1 s until it returns something truthy (returned), or fail."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
