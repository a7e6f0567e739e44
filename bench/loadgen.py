"""The load generator: Debian's `wrk` driven by the Lua scripts in `bench/lua/`.

`wrk` is C with an event loop per thread; `capacity()` measures it against nginx answering a
fixed response, to show it can drive far more requests than the service under test.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

LUA = Path(__file__).resolve().parent / "lua"
WRK = shutil.which("wrk")
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)


def script(name: str) -> Path:
    """A Lua script with the common `done()` reporter appended (written to a temp file)."""
    text = (LUA / f"{name}.lua").read_text() + "\n" + (LUA / "report.lua").read_text()
    handle = tempfile.NamedTemporaryFile("w", suffix=f"-{name}.lua", delete=False)
    handle.write(text)
    handle.close()
    return Path(handle.name)


def run(url: str, lua: str, connections: int, seconds: float, env: dict | None = None,
        threads: int | None = None) -> dict:
    """Run wrk; returns requests, rps, latency percentiles (ms) and error counts."""
    if WRK is None:
        raise RuntimeError("wrk is not installed (apt-get install wrk, or `make bench-deps`)")
    threads = threads or min(connections, 2)
    path = script(lua)
    try:
        out = subprocess.run(
            [WRK, "-t", str(threads), "-c", str(connections), "-d", f"{max(1, round(seconds))}s", "--timeout", "10s",
             "-s", str(path), url],
            env={**os.environ, "BENCH_THREADS": str(threads), **(env or {})},
            capture_output=True, text=True, timeout=seconds + 60)
    finally:
        path.unlink(missing_ok=True)
    line = next((l for l in out.stdout.splitlines() if l.startswith("BENCH_JSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk failed: {out.stdout}\n{out.stderr}")
    raw = json.loads(line[len("BENCH_JSON "):])
    seconds_measured = raw["duration_us"] / 1e6
    errors = {k[len("errors_"):]: v for k, v in raw.items() if k.startswith("errors_") and v}
    return {
        "connections": connections, "threads": threads, "requests": raw["requests"],
        "seconds": round(seconds_measured, 2),
        "rps": round((raw["requests"] - raw["errors_status"]) / seconds_measured, 1),
        "p50_ms": raw["p50_us"] / 1000, "p90_ms": raw["p90_us"] / 1000, "p99_ms": raw["p99_us"] / 1000,
        "max_ms": raw["max_us"] / 1000, "errors": errors,
    }


def capacity(seconds: float, connections: int = 64) -> dict | None:
    """wrk's own ceiling here: requests/s against nginx returning a small fixed response."""
    if NGINX is None:
        return None
    with fixed_server('{"status":"ok"}') as url:
        return run(url, "get", connections, seconds)


@contextlib.contextmanager
def fixed_server(body: str, content_type: str = "application/json"):
    """nginx (one worker, no access log) answering every GET with `body`: yields its base URL
    (`http://127.0.0.1:PORT/`). `body` must not hold a single quote."""
    import socket
    import time
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = Path(tempfile.mkdtemp(prefix="bench-nginx-"))
    user = "user root;\n" if os.geteuid() == 0 else ""
    (tmp / "nginx.conf").write_text(
        f"{user}worker_processes 1; daemon off; pid {tmp}/nginx.pid; error_log {tmp}/error.log;\n"
        f"events {{ worker_connections 1024; }}\n"
        f"http {{ access_log off; client_body_temp_path {tmp}; proxy_temp_path {tmp}; fastcgi_temp_path {tmp};"
        f" uwsgi_temp_path {tmp}; scgi_temp_path {tmp}; keepalive_requests 1000000;\n"
        f"  server {{ listen 127.0.0.1:{port}; location / {{ default_type {content_type}; return 200 '{body}'; }} }} }}\n")
    proc = subprocess.Popen([NGINX, "-p", str(tmp), "-c", str(tmp / "nginx.conf"), "-e", str(tmp / "error.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/"
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
