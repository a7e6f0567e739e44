"""`svc-auth serve` as a real process: graceful SIGTERM, `--processes N` metrics, JSON logs."""
import json
import os
import signal
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import basic_auth, free_port, settings_env, start_process, stop_process
from metrics_support import sample


def get(port: int, path: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return response.status, response.read()


def children_of(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


@pytest.mark.slow
def test_sigterm_finishes_the_request_in_flight(settings, world, tmp_path):
    port = free_port()
    log_path = tmp_path / "serve.log"
    proc = start_process(["serve", "--port", str(port)], settings_env(settings), port, log_path=log_path)
    try:
        app = world.app
        body = b"grant_type=client_credentials"
        head = (f"POST /v1/oauth/token HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Authorization: {basic_auth(app.client_id, world.secret)}\r\n"
                f"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {len(body)}\r\n"
                f"X-Request-Id: slow-1\r\n\r\n").encode()
        slow = socket.create_connection(("127.0.0.1", port), timeout=10)
        slow.sendall(head + body[:10])  # the request is in flight: headers and part of its body
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.8)
        assert proc.poll() is None, "the server must wait for the request in flight"
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()  # no new connections
        slow.sendall(body[10:])
        response = b""
        while b"\r\n\r\n" not in response or not response.rstrip().endswith(b"}"):
            chunk = slow.recv(65536)
            if not chunk:
                break
            response += chunk
        slow.close()
        status_line, _, rest = response.partition(b"\r\n")
        assert status_line == b"HTTP/1.1 200 OK", response
        assert json.loads(rest.split(b"\r\n\r\n", 1)[1])["token_type"] == "Bearer"
        assert proc.wait(10) == 0
    finally:
        stop_process(proc)
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    token_lines = [line for line in lines if line.get("request_id") == "slow-1"]
    assert token_lines and token_lines[0]["status"] == 200 and token_lines[0]["route"] == "/v1/oauth/token"
    assert lines[-1]["message"] == "svc-auth stopped"


@pytest.mark.slow
def test_processes_share_metrics_and_all_stop_on_sigterm(settings, runtime, tmp_path):
    port = free_port()
    proc = start_process(["serve", "--port", str(port), "--processes", "2"], settings_env(settings), port,
                         log_path=tmp_path / "serve.log")
    try:
        deadline = time.time() + 10  # the socket listens before the workers are forked
        while len(workers := children_of(proc.pid)) < 2 and time.time() < deadline:
            time.sleep(0.05)
        assert len(workers) == 2
        metrics_dir = Path(settings.var_dir) / "metrics" / f"serve-{port}"
        sent = 0
        # A new connection each: the kernel hands them to whichever process accepts first, so keep
        # going until both have served (each writes its own counter file).
        while sent < 30 or (len(list(metrics_dir.glob("counter_*.db"))) < 2 and sent < 2000):
            assert get(port, "/healthz")[0] == 200
            sent += 1
        assert len(list(metrics_dir.glob("counter_*.db"))) == 2, "both processes served requests"
        # Whichever process answers the scrape reports the sum over both. A request is counted just
        # after its response is written, so the last one may land a moment after the client saw it.
        deadline, matches = time.time() + 5, 0
        while matches < 4 and time.time() < deadline:
            text = get(port, "/metrics")[1].decode()
            counted = sample(text, "svc_http_requests_total", route="/healthz", method="GET", status="200")
            assert counted <= sent
            matches = matches + 1 if counted == sent else 0
        assert matches == 4, f"/metrics reported {counted} of {sent} requests"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        assert not any(alive(pid) for pid in workers)
    finally:
        stop_process(proc)


@pytest.mark.slow
def test_sigterm_under_processes_refuses_new_connections_at_once_and_finishes_in_flight(settings, world, tmp_path):
    """Every process stops accepting: the parent closes its copy of the listening socket too (it
    used to keep it, so the kernel accepted connections nobody would ever answer)."""
    port = free_port()
    proc = start_process(["serve", "--port", str(port), "--processes", "2"], settings_env(settings), port,
                         log_path=tmp_path / "serve.log")
    try:
        deadline = time.time() + 10
        while len(children_of(proc.pid)) < 2 and time.time() < deadline:
            time.sleep(0.05)
        assert get(port, "/healthz")[0] == 200
        app = world.app
        body = b"grant_type=client_credentials"
        head = (f"POST /v1/oauth/token HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Authorization: {basic_auth(app.client_id, world.secret)}\r\n"
                f"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        slow = socket.create_connection(("127.0.0.1", port), timeout=10)
        slow.sendall(head + body[:10])  # in flight in one of the workers
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        # 0.5 s later a new connection is refused (before: accepted into the parent's socket, never answered).
        try:
            probe = socket.create_connection(("127.0.0.1", port), timeout=1)
        except ConnectionRefusedError:
            pass
        else:  # accepted after all: then it must at least be answered (or reset) at once
            probe.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            probe.settimeout(0.5)
            try:
                answer = probe.recv(100)
            except ConnectionResetError:
                answer = b"reset"
            except socket.timeout:
                pytest.fail("a new connection 0.5 s after SIGTERM was accepted and not answered")
            finally:
                probe.close()
            assert answer, "accepted, then closed without an answer"
        with pytest.raises(ConnectionRefusedError):  # and from then on it stays refused
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        assert proc.poll() is None, "the worker with a request in flight is still finishing it"
        slow.sendall(body[10:])
        response = b""
        while not response.rstrip().endswith(b"}"):
            chunk = slow.recv(65536)
            if not chunk:
                break
            response += chunk
        slow.close()
        assert response.startswith(b"HTTP/1.1 200 OK"), response
        assert proc.wait(15) == 0
    finally:
        stop_process(proc)
