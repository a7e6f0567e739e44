"""`svc-auth serve` as a real process: graceful SIGTERM, `--processes N` metrics, JSON logs."""
import json
import os
import re
import signal
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from helpers.http import basic_auth
from helpers.metrics import requests_per_process, sample
from helpers.processes import (children_of, free_port, settings_env, start_process, stop_process, wait_until,
                               wait_until_listening)


def get(port: int, path: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return response.status, response.read()


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
        wait_until_listening(log_path)
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
        wait_until_listening(tmp_path / "serve.log", processes=2)
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


CONNECTIONS = 32      # keep-alive connections opened at once, as wrk does (issue 29's Done-when)
ROUNDS = 3            # bursts before and after a worker restart
REQUESTS_EACH = 2     # keep-alive requests on every connection


def keep_alive_connections_at_once(port: int) -> int:
    """Open CONNECTIONS connections at once, then send REQUESTS_EACH requests on every one of them,
    all in flight together; returns the number of requests answered."""
    import http.client
    connections = [http.client.HTTPConnection("127.0.0.1", port, timeout=20) for _ in range(CONNECTIONS)]
    try:
        for conn in connections:
            conn.connect()
        for _ in range(REQUESTS_EACH):
            for conn in connections:
                conn.request("GET", "/healthz")
            for conn in connections:
                response = conn.getresponse()
                response.read()
                assert response.status == 200
    finally:
        for conn in connections:
            conn.close()
    return len(connections) * REQUESTS_EACH


@pytest.mark.slow
@pytest.mark.serial  # a process starved of CPU past STALL_SECONDS hands its share to the other, by design
def test_32_connections_at_once_are_split_evenly_before_and_after_a_restart(settings, tmp_path):
    """Under `--processes 2` the processes share one listening socket and each accepts only while
    it holds no more connections than the other + 1 (ops/balance.py), so 32 keep-alive connections
    opened at once end 16/16 (+-2) in every burst, and each process answers at least a third of the
    requests (issue 29's Done-when). With a socket per process (SO_REUSEPORT) the kernel's random
    hash gave one of them fewer than a third of 32 connections in 5% of bursts; with one shared
    socket and Tornado's accept loop, whichever woke first often took them all. A process's
    requests are read from its own metric files (one per pid)."""
    port = free_port()
    proc = start_process(["serve", "--port", str(port), "--processes", "2"], settings_env(settings), port,
                         log_path=tmp_path / "serve.log")
    metrics_dir = Path(settings.var_dir) / "metrics" / f"serve-{port}"
    try:
        wait_until_listening(tmp_path / "serve.log", processes=2)
        workers = children_of(proc.pid)
        assert len(workers) == 2

        def shares_after_a_burst(pids):
            before = requests_per_process(metrics_dir)
            sent = keep_alive_connections_at_once(port)
            deadline = time.time() + 10  # a request is counted just after its response is written
            while time.time() < deadline:
                after = requests_per_process(metrics_dir)
                served = {pid: after.get(pid, 0) - before.get(pid, 0) for pid in pids}
                if sum(served.values()) == sent:
                    return served, sent
                time.sleep(0.05)
            raise AssertionError(f"counted {served} of {sent} requests")

        for _ in range(ROUNDS):
            served, sent = shares_after_a_burst(workers)
            assert all(count >= sent / 3 for count in served.values()), served

        # A worker that dies is restarted, accepts from the same socket, and takes its share again.
        os.kill(workers[0], signal.SIGKILL)
        deadline = time.time() + 30
        while not ((now := children_of(proc.pid)) and len(now) == 2 and workers[0] not in now) \
                and time.time() < deadline:
            time.sleep(0.05)
        assert len(now) == 2 and workers[0] not in now, now
        wait_until_listening(tmp_path / "serve.log", processes=3)  # the new worker accepts
        for _ in range(ROUNDS):
            served, sent = shares_after_a_burst(now)
            assert all(count >= sent / 3 for count in served.values()), served
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        stop_process(proc)


# --- the supervisor of `--processes N` (issue 36 item 6) --------------------------------------
# The database does not matter to the supervisor: these run on SQLite only.
supervisor_backend = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
SERVING = ") serving"  # the supervisor's "worker N (pid P) serving": its first heartbeat


def start_supervised(settings, tmp_path, *options: str):
    """`serve --processes 2` with supervisor `options`, once both workers serve."""
    port = free_port()
    log_path = tmp_path / "serve.log"
    proc = start_process(["serve", "--port", str(port), "--processes", "2", *options], settings_env(settings), port,
                         log_path=log_path)
    wait_for_log(log_path, SERVING, 2)
    return proc, port, log_path


def wait_for_log(log_path: Path, text: str, count: int = 1, timeout: float = 60.0) -> str:
    """Until `text` appears `count` times in the log (lines the supervisor writes as it acts)."""
    deadline = time.time() + timeout
    while (log := log_path.read_text()).count(text) < count:
        assert time.time() < deadline, f"waiting for {count}x {text!r}:\n" + log[-3000:]
        time.sleep(0.02)
    return log


def worker_pids(log_path: Path) -> dict[int, int]:
    """slot -> pid of its current worker, from the supervisor's "worker N started (pid P)" lines."""
    return {int(slot): int(pid) for slot, pid in re.findall(r"worker (\d+) started \(pid (\d+)\)", log_path.read_text())}


@pytest.mark.slow
@supervisor_backend
def test_a_crash_loop_keeps_serving_with_backoff_and_never_gives_up(settings, runtime, tmp_path):
    """105 crashes (more than the old MAX_RESTARTS=100 over the whole life): every one is replaced,
    after a backoff that grows per slot, and the server keeps answering on both workers."""
    proc, port, log_path = start_supervised(settings, tmp_path, "--restart-budget", "1000",
                                            "--restart-backoff-max", "0.05")
    try:
        for crash in range(105):
            victim = worker_pids(log_path)[crash % 2]
            os.kill(victim, signal.SIGKILL)
            wait_for_log(log_path, SERVING, 3 + crash)  # its replacement serves
            assert get(port, "/healthz")[0] == 200
        log = log_path.read_text()
        assert "giving up" not in log
        assert set(re.findall(r"restarting in ([\d.]+)s", log)) == {"0.05"}, "the backoff, capped at its maximum"
        workers = children_of(proc.pid)
        assert len(workers) == 2 and sorted(workers) == sorted(worker_pids(log_path).values())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        stop_process(proc)


@pytest.mark.slow
@supervisor_backend
def test_restarts_back_off_and_wait_once_the_budget_per_minute_is_spent(settings, runtime, tmp_path):
    proc, port, log_path = start_supervised(settings, tmp_path, "--restart-budget", "2")
    try:
        for crash in range(2):  # the same slot twice: 0.1 s, then 0.2 s
            os.kill(worker_pids(log_path)[0], signal.SIGKILL)
            wait_for_log(log_path, SERVING, 3 + crash)
        log = log_path.read_text()
        assert re.search(r"worker 0 \(pid \d+\) was killed by SIGKILL; restarting in 0\.10s", log), log
        assert re.search(r"worker 0 \(pid \d+\) was killed by SIGKILL; restarting in 0\.20s", log), log
        os.kill(worker_pids(log_path)[1], signal.SIGKILL)  # the third in a minute waits for the budget
        log = wait_for_log(log_path, "restart budget of 2 per minute spent")
        waits = re.findall(r"restart budget of 2 per minute spent, restarting in ([\d.]+)s", log)
        assert 30 < float(waits[0]) <= 60, waits
        assert get(port, "/healthz")[0] == 200  # the other worker serves meanwhile
        proc.send_signal(signal.SIGTERM)  # the pending restart is cancelled: the parent exits at once
        assert proc.wait(15) == 0
        assert log_path.read_text().count(SERVING) == 4
    finally:
        stop_process(proc)


@pytest.mark.slow
@supervisor_backend
def test_a_stopped_worker_is_killed_and_replaced(settings, runtime, tmp_path):
    proc, port, log_path = start_supervised(settings, tmp_path, "--heartbeat-timeout", "1")
    try:
        victim = worker_pids(log_path)[0]
        stopped_at = time.time()
        os.kill(victim, signal.SIGSTOP)
        wait_for_log(log_path, SERVING, 3, timeout=20)
        assert time.time() - stopped_at < 10
        log = log_path.read_text()
        assert re.search(rf"worker 0 \(pid {victim}\) no heartbeat for [\d.]+s; sending SIGKILL", log), log
        assert not alive(victim)
        workers = children_of(proc.pid)
        assert len(workers) == 2 and victim not in workers
        assert get(port, "/healthz")[0] == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        stop_process(proc)


@pytest.mark.slow
@supervisor_backend
def test_sigterm_while_a_worker_is_stopped_kills_it_after_the_drain_timeout(settings, runtime, tmp_path):
    proc, port, log_path = start_supervised(settings, tmp_path, "--drain-timeout", "1")
    try:
        workers = children_of(proc.pid)
        os.kill(workers[0], signal.SIGSTOP)
        started = time.time()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 1, "the parent exits, non-zero: it had to kill a worker"
        assert time.time() - started < 1 + 5 + 3
        assert not any(alive(pid) for pid in workers)
        assert "still running 6.0s after SIGTERM; sending SIGKILL" in log_path.read_text()
    finally:
        for pid in children_of(proc.pid):
            os.kill(pid, signal.SIGKILL)
        stop_process(proc)


# A worker that meets a setting only it reads (the parent's own checks passed): its Runtime raises.
FAILING_WORKER = """
import os, sys
sys.path.insert(0, os.getcwd())
import server
from conf import ConfigError
parent = os.getpid()
real = server.Runtime
def runtime(settings):
    if os.getpid() != parent:
        raise ConfigError("the worker cannot start (a setting only workers read)")
    return real(settings)
server.Runtime = runtime
from cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
@supervisor_backend
def test_a_worker_failing_at_startup_stops_the_server_with_one_line(settings, runtime, tmp_path):
    import subprocess
    import sys
    from helpers.environment import ROOT
    port = free_port()
    env = settings_env(settings)
    started = time.time()
    out = subprocess.run([sys.executable, "-c", FAILING_WORKER, "serve", "--port", str(port), "--processes", "2"],
                         env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr
    assert time.time() - started < 40
    last = out.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"svc-auth serve: worker \d \(pid \d+\) exited with status 2 before it served "
                        r"\(failed at startup; see its error above\); stopping the server", last), out.stderr
    assert "svc-auth: configuration error: the worker cannot start" in out.stderr
    assert "restarting" not in out.stderr


@pytest.mark.slow
@pytest.mark.serial  # a time bound: run alone, not beside another test process's load
@supervisor_backend
def test_a_stopped_worker_does_not_hold_back_the_others(settings, runtime, tmp_path):
    """A stopped worker's connection count stays in shared memory; the live one used to compare
    itself with it, pause once it was one connection ahead, and take one connection per
    STALL_SECONDS + POLL_SECONDS (~55 ms) until the supervisor's heartbeat kill (30 s). A worker
    whose heartbeat is older than 2 beat intervals (1 s each here) is no longer counted against.
    The broken code cannot pass the bound: each connection past the second waited >= 50 ms, so
    100 took at least 4.9 s (2.2 s for 40 in the reviewer's run); fixed, 100 take a fraction of a second."""
    import http.client
    proc, port, log_path = start_supervised(settings, tmp_path)  # heartbeat timeout 30 s: not killed meanwhile
    victim = worker_pids(log_path)[0]
    connections = []
    try:
        os.kill(victim, signal.SIGSTOP)
        time.sleep(2 * 1.0 + 1.0)  # its last beat is now older than 2 beat intervals (ops/balance.py STALE_BEATS)
        started = time.monotonic()
        for _ in range(100):  # kept open: the live worker's count grows far ahead of the stopped one's
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
            connections.append(conn)
            conn.request("GET", "/healthz")
            response = conn.getresponse()
            response.read()
            assert response.status == 200
        took = time.monotonic() - started
        assert took < 3.0, f"100 new connections took {took:.2f}s beside a stopped worker"
        assert victim in children_of(proc.pid), "the stopped worker was not replaced meanwhile"
        os.kill(victim, signal.SIGCONT)
        for conn in connections:
            conn.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        for conn in connections:
            conn.close()
        try:
            os.kill(victim, signal.SIGCONT)
        except ProcessLookupError:
            pass
        stop_process(proc)


def kill_leftovers(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.slow
@supervisor_backend
def test_sighup_to_the_supervisor_stops_every_worker(settings, runtime, tmp_path):
    """SIGHUP drains and stops like SIGTERM. The supervisor had no handler for it (and installed
    its others only after forking): a HUP killed the parent alone and its workers kept serving,
    reparented to init."""
    proc, port, log_path = start_supervised(settings, tmp_path)
    workers = children_of(proc.pid)
    try:
        assert len(workers) == 2
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(15) == 0, "the parent drained its workers and exited"
        assert not any(alive(pid) for pid in workers)
        assert "SIGHUP received" in log_path.read_text()
    finally:
        kill_leftovers(workers)
        stop_process(proc)


@pytest.mark.slow
@supervisor_backend
def test_workers_exit_when_the_supervisor_is_killed(settings, runtime, tmp_path):
    """A supervisor killed outright (SIGKILL, no handler can run) used to leave its workers serving
    with PPID 1 and nobody to replace or stop them; now each gets SIGTERM from the kernel as its
    parent dies (PR_SET_PDEATHSIG), or sees it gone at its next heartbeat, and exits."""
    proc, port, log_path = start_supervised(settings, tmp_path)
    workers = children_of(proc.pid)
    try:
        assert len(workers) == 2
        proc.kill()
        proc.wait(15)
        wait_until(lambda: not any(alive(pid) for pid in workers), timeout=10, what="the orphaned workers to exit")
        with pytest.raises(ConnectionRefusedError):  # nobody holds the listening socket any more
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        kill_leftovers(workers)
        stop_process(proc)


def test_origins_reported_by_a_trusted_proxy_are_logged_for_at_most_16(settings, tmp_path):
    """The Host (X-Forwarded-Host) is the client's choice: a serve process behind a trusted proxy
    logged a WARNING for every new one and remembered them all. 100 distinct hosts: 16 warnings and
    one line saying further ones are not logged."""
    port = free_port()
    log_path = tmp_path / "serve.log"
    env = settings_env(settings, SVC_TRUSTED_PROXIES="127.0.0.1/32")
    proc = start_process(["serve", "--port", str(port)], env, port, log_path=log_path)
    try:
        wait_until_listening(log_path)
        for n in range(100):
            request = urllib.request.Request(f"http://127.0.0.1:{port}/healthz", headers={
                "X-Forwarded-Proto": "https", "X-Forwarded-Host": f"host-{n}.attacker.example"})
            with urllib.request.urlopen(request, timeout=10) as response:
                assert response.status == 200
    finally:
        stop_process(proc)
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    warnings = [line["message"] for line in lines if line["level"] == "WARNING" and "clients reach" in line["message"]]
    assert len(warnings) == 17, warnings
    assert [w.split(" but ")[0] for w in warnings[:16]] == [
        f"clients reach this service at https://host-{n}.attacker.example" for n in range(16)]
    assert "further ones are not logged" in warnings[16]
