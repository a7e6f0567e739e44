"""PostgreSQL or Redis restarted under the whole production shape: `serve --processes 2`, a
`worker` and a `scheduler`, on a PostgreSQL and a Redis of the test's own (issue 29, item 2).

While the dependency is down, requests that need it answer 503 and the loops log their failures
(the outage landed). Once it accepts connections again, within RECOVERY_SECONDS the scheduler
ticks and the worker sweeps without error and say they recovered, the scheduler queues a night
and the worker's consumer takes it, and no request answered later than CLIENT_SECONDS after the
restart is a 5xx, with no process restarted.
"""
from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

import pytest

from bench.instances import LocalPostgres, LocalRedis
from bench.outage import NO_LIMITS, Requester, client_token, seed
from conf import Settings
from helpers.processes import free_port, settings_env, start_process, stop_process
from workers.snapshot import NIGHTLY_JOB

RECOVERY_SECONDS = 15.0  # the scheduler's tick and the worker's sweep run without error again
CLIENT_SECONDS = 1.0     # no 5xx answered later than this after the restart
SCHEDULER_INTERVAL = 0.5  # `svc-auth scheduler --interval`
RECOVERY_SETTING = 4     # SVC_TASK_RECOVERY_SECONDS: the worker sweeps every second


def log_lines(path: Path) -> list[dict]:
    lines = []
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        entry["at"] = dt.datetime.fromisoformat(entry["ts"]).timestamp()
        lines.append(entry)
    return lines


def first_line(path: Path, needle: str, after: float = 0.0, timeout: float = 60.0) -> dict:
    """The first log line of `path` containing `needle` written after `after` (wall clock), waiting
    up to `timeout` seconds for it."""
    deadline = time.time() + timeout
    while True:
        for entry in log_lines(path):
            if entry["at"] > after and needle in entry["message"]:
                return entry
        if time.time() > deadline:
            raise AssertionError(f"no {needle!r} in {path.name} after {after} within {timeout}s")
        time.sleep(0.05)


def sync_window_around_now() -> str:
    """SVC_SYNC_WINDOW open from an hour ago to an hour from now (UTC): the scheduler queues
    tonight's sync at its next tick whenever the night's claim is removed."""
    now = dt.datetime.now(dt.timezone.utc)
    return f"{(now - dt.timedelta(hours=1)):%H:%M}-{(now + dt.timedelta(hours=1)):%H:%M}"


def forget_the_night(database_url: str) -> None:
    """Remove the scheduler's claim of tonight, so that its next tick queues the night again."""
    import psycopg2
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cursor:
            cursor.execute("DELETE FROM scheduled_run WHERE job = %s", (NIGHTLY_JOB,))
    finally:
        conn.close()


class Shape:
    """serve --processes 2, a worker and a scheduler over `pg` and `redis`, logging to `tmp`."""

    def __init__(self, pg: LocalPostgres, redis: LocalRedis, tmp: Path):
        self.tmp = tmp
        settings = Settings.build(issuer="http://127.0.0.1:8888", database_url=pg.url, redis_url=redis.url,
                                  var_dir=str(tmp / "var"), keys_dir=str(tmp / "keys"), hmac_key="w" * 32,
                                  sync_window=sync_window_around_now())
        self.seeded = seed(settings)
        self.port = free_port()
        env = settings_env(settings, SVC_RATE_LIMITS=NO_LIMITS, SVC_TASK_RECOVERY_SECONDS=RECOVERY_SETTING)
        self.logs = {name: tmp / f"{name}.log" for name in ("serve", "worker", "scheduler")}
        self.procs = {}
        self.procs["serve"] = start_process(["serve", "--port", str(self.port), "--processes", "2"], env,
                                            self.port, log_path=self.logs["serve"])
        self.procs["worker"] = start_process(["worker"], env, log_path=self.logs["worker"])
        self.procs["scheduler"] = start_process(["scheduler", "--interval", str(SCHEDULER_INTERVAL)], env,
                                                log_path=self.logs["scheduler"])
        # Working before the outage: the night is queued and the worker fans it out.
        first_line(self.logs["scheduler"], "queued the nightly sync")
        first_line(self.logs["worker"], "queued 1 organizations")
        self.requester = Requester(self.port, "organizations", "GET",
                                   f"/v1/applications/{self.seeded['app_id']}/organizations",
                                   {"Authorization": f"Bearer {client_token(self.port, self.seeded)}"},
                                   pause=0.005)
        self.requester.start()
        self.wait_for_answer(lambda status: status == 200, since=0.0)

    def wait_for_answer(self, matches, since: float, timeout: float = 30.0) -> float:
        """The monotonic time of the first request started after `since` whose status `matches`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for started, status, _, _ in list(self.requester.records):
                if started > since and matches(status):
                    return started
            time.sleep(0.02)
        raise AssertionError(f"no such answer since {since}: {self.requester.records[-5:]}")

    def failures_after(self, name: str, needle: str, after: float) -> list[str]:
        return [e["message"] for e in log_lines(self.logs[name]) if e["at"] > after and needle in e["message"]]

    def close(self) -> None:
        if self.requester.is_alive():
            self.requester.stop()
        for proc in self.procs.values():
            stop_process(proc)


def restart_under_load(tmp_path: Path, dependency: str) -> dict:
    """Stop `dependency` ("postgresql" or "redis") under the production shape until the outage is
    seen, start it again, and measure the recovery; asserts what the module docstring says."""
    pg, redis = LocalPostgres(), LocalRedis()
    shape = None
    try:
        pg.start()
        redis.start()
        shape = Shape(pg, redis, tmp_path)
        server = pg if dependency == "postgresql" else redis
        stopped_wall, stopped = time.time(), time.monotonic()
        server.stop()
        # The outage landed: requests that need it answer 503, and the loops that use it fail.
        shape.wait_for_answer(lambda status: status == 503, since=stopped)
        if dependency == "postgresql":
            first_line(shape.logs["scheduler"], "scheduler tick failed", after=stopped_wall)
            first_line(shape.logs["worker"], "recovery sweep failed", after=stopped_wall)
        else:
            forget_the_night(pg.url)  # the next tick claims the night and cannot queue it
            first_line(shape.logs["scheduler"], "scheduler tick failed", after=stopped_wall)
            first_line(shape.logs["worker"], "Consumer encountered a connection error", after=stopped_wall)
        # A loop may recover while `start()` is still returning: its log line is looked for from the
        # moment the server was asked to start (`restarting_wall`), its delay counted from `back_wall`.
        restarting_wall = time.time()
        server.start()
        back_wall, back = time.time(), time.monotonic()
        recovered = {
            "scheduler": first_line(shape.logs["scheduler"], "scheduler tick succeeded again", after=restarting_wall,
                                    timeout=RECOVERY_SECONDS)["at"] - back_wall}
        if dependency == "postgresql":
            recovered["sweep"] = first_line(shape.logs["worker"], "recovery sweep succeeded again", after=restarting_wall,
                                            timeout=RECOVERY_SECONDS)["at"] - back_wall
            forget_the_night(pg.url)
        # The scheduler queues the night again and the worker's consumer takes it.
        recovered["night_queued"] = first_line(shape.logs["scheduler"], "queued the nightly sync", after=restarting_wall,
                                               timeout=RECOVERY_SECONDS)["at"] - back_wall
        recovered["night_consumed"] = first_line(shape.logs["worker"], "queued 1 organizations", after=restarting_wall,
                                                 timeout=RECOVERY_SECONDS)["at"] - back_wall
        recovered["first_200"] = shape.wait_for_answer(lambda status: status == 200, since=back) - back
        time.sleep(max(0.0, back + 3.0 - time.monotonic()))  # load on for at least 3 s after the restart
        shape.requester.stop()
        records = shape.requester.records
        late = [(round(s + d - back, 3), status) for s, status, _, d in records
                if s + d > back + CLIENT_SECONDS and not 200 <= status < 500]
        assert not late, f"answered later than {CLIENT_SECONDS}s after the restart: {late[:10]}"
        assert not [status for _, status, _, _ in records if status >= 500 and status != 503]
        outage_503 = sum(1 for s, status, _, _ in records if stopped <= s < back and status == 503)
        assert outage_503 > 0
        # No loop keeps failing once it recovered (it ran several more rounds since).
        done_wall = time.time()
        assert not shape.failures_after("scheduler", "failed", back_wall + recovered["scheduler"])
        assert not shape.failures_after("worker", "recovery sweep failed",
                                        back_wall + recovered.get("sweep", 0.0)), "the sweep kept failing"
        for name, proc in shape.procs.items():
            assert proc.poll() is None, f"{name} exited"  # recovered without a restart
        errors = [e["message"] for e in log_lines(shape.logs["serve"])
                  if back_wall + CLIENT_SECONDS < e["at"] < done_wall and ("exc" in e or e["level"] == "ERROR")]
        assert not errors, errors
        return {"dependency": dependency, "requests": len(records), "503_during_outage": outage_503,
                "recovered_after_s": {k: round(v, 3) for k, v in recovered.items()}}
    finally:
        if shape is not None:
            shape.close()
        pg.destroy()
        redis.destroy()


@pytest.mark.slow
def test_postgresql_restart_under_scheduler_worker_and_serve(tmp_path):
    print(json.dumps(restart_under_load(tmp_path, "postgresql")))


@pytest.mark.slow
def test_redis_restart_under_scheduler_worker_and_serve(tmp_path):
    print(json.dumps(restart_under_load(tmp_path, "redis")))
