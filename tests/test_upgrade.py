"""Upgrades from every earlier release lose nothing (issue 36), on SQLite and PostgreSQL.

Each release fixture (tests/fixtures/releases/<commit>/<backend>/, written by that release's own
code with `make_fixtures.py`) is restored, the current code's `svc-auth db migrate` runs on it as a
real subprocess, every row is still there, and a real `serve` of the current code still does what
the release did: the old client secret gets a token, the JWKS still has the old kids, the tokens
issued before verify, the appointments page, the chart URL, console sign-in, the invitation link
(a check of a feature the release did not have, as its day.json's `lacks` records, is left out).
A second `db migrate` changes nothing;
a `db migrate` killed (SIGKILL) inside a migration loses nothing, and the next one completes it.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import jwt
import pytest

from helpers.console import form_xsrf
from helpers.environment import REDIS_URL, ROOT
from helpers.http import LiveHttp
from helpers.processes import free_port, start_process, stop_process, wait_until
from helpers.releases import RELEASE_FIXTURES, ReleaseCode, table_counts

FIXTURES = RELEASE_FIXTURES
SETTINGS = json.loads((FIXTURES / "settings.json").read_text())
RELEASES = [line.split()[0] for line in (FIXTURES / "releases.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]  # oldest first; the last is the previous release
# A rolling upgrade: the previous release runs on the schema the current code migrated to; and the
# release of issue 36's report (its `orgs create` failed on a NOT NULL column without a default).
ROLLING = (RELEASES[-1], "8cb07c3")
BACKUP_LINE = re.compile(r"^backup of the database before migrating: (.+)$", re.M)

BOOKKEEPING = ("schema_version", "change_version")
"""Tables a migration may add rows to: the steps applied, and migration 3505's `directory` version."""


def restore(commit: str, backend: str, tmp_path: Path, scratch_database) -> tuple[str, dict, dict]:
    """The release's database and var/ under tmp_path: (database URL, child env, its day.json)."""
    fixture = FIXTURES / commit / backend
    day = json.loads((fixture / "day.json").read_text())
    shutil.copytree(fixture / "var", tmp_path / "var")
    if backend == "sqlite":
        shutil.copy(fixture / "svc.db", tmp_path / "svc.db")
        url = f"sqlite:///{tmp_path / 'svc.db'}"
    else:
        url = scratch_database()
        subprocess.run(["psql", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(fixture / "dump.sql"), url],
                       check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SVC_")}
    env.update(SETTINGS)
    env.update(SVC_DATABASE_URL=url, SVC_SANDBOX="on", SVC_VAR_DIR=str(tmp_path / "var"),
               SVC_PUBLIC_URL=SETTINGS["SVC_ISSUER"])
    return url, env, day


def svc_auth(env: dict, *args: str) -> subprocess.CompletedProcess:
    """The current code's `svc-auth ARGS` as a subprocess."""
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=str(ROOT), env=env, capture_output=True,
                          text=True, timeout=300)


def serve_works_as_before(env: dict, day: dict, tmp_path) -> None:
    """A `serve` on the upgraded database, its clock 10 minutes after the day's client token was
    made, answers as the previous release did (`works_as_before`)."""
    made_at = jwt.decode(day["client_token"], options={"verify_signature": False})["iat"]
    env["SVC_CLOCK_OFFSET"] = str(made_at + 600 - time.time())
    port = free_port()
    proc = start_process(["serve", "--port", str(port)], env, port, log_path=tmp_path / "serve.log")
    try:
        works_as_before(LiveHttp(f"http://127.0.0.1:{port}"), day)
    finally:
        stop_process(proc)


@pytest.mark.parametrize("commit", RELEASES)
def test_an_upgrade_keeps_every_row_and_everything_works(commit, backend, tmp_path, scratch_database):
    url, env, day = restore(commit, backend, tmp_path, scratch_database)
    before = table_counts(url)
    assert before == day["counts"]  # the fixture is what the release wrote

    migrated = svc_auth(env, "db", "migrate")
    assert migrated.returncode == 0, migrated.stderr
    after = table_counts(url)
    assert {t: after.get(t) for t in before if t not in BOOKKEEPING} == \
        {t: n for t, n in before.items() if t not in BOOKKEEPING}
    assert all(after.get(t, 0) >= before.get(t, 0) for t in BOOKKEEPING)
    if backend == "sqlite":  # a backup copy first, with every row
        backup = BACKUP_LINE.search(migrated.stdout)
        assert backup, migrated.stdout
        assert table_counts(f"sqlite:///{backup.group(1)}") == before

    again = svc_auth(env, "db", "migrate")
    assert again.returncode == 0 and again.stdout.strip() == "schema is up to date", again.stdout + again.stderr
    assert table_counts(url) == after
    status = svc_auth(env, "db", "status", "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["pending"] == [], status.stdout

    # The upgraded service runs ten minutes after the release's day: its invitation (7 days) is still
    # valid, and so is a key rotated away that day (kept an hour, the ID tokens' lifetime: 0.1.0's
    # rotation retires the old key an hour after, with no pre-publication, so "an hour after" was
    # past it).
    serve_works_as_before(env, day, tmp_path)


# What a release may lack (make_fixtures.py records it in day.json's `lacks`): only these checks may be left out.
LACKABLE = {"apps show", "developer console"}


def works_as_before(http: LiveHttp, day: dict) -> None:
    seed, lacks = day["seed"], set(day.get("lacks", ()))
    assert lacks <= LACKABLE, lacks
    # The old client secret still gets a token (the fallback made before is still pending).
    status, _, token = http.call("POST", "/v1/oauth/token", {
        "grant_type": "client_credentials", "client_id": seed["client_id"], "client_secret": seed["client_secret"]})
    assert status == 200, token
    partner = {"Authorization": f"Bearer {token['access_token']}"}
    # The JWKS still publishes every kid the release published, and the tokens it issued verify.
    status, _, jwks = http.call("GET", "/.well-known/jwks.json")
    assert status == 200 and set(day["kids"]) <= {k["kid"] for k in jwks["keys"]}, jwks
    keys = {k["kid"]: jwt.PyJWK(k).key for k in jwks["keys"]}
    issued = {**day["launch_tokens"], "client_token": day["client_token"]}
    for name, value in issued.items():
        kid = jwt.get_unverified_header(value)["kid"]
        claims = jwt.decode(value, keys[kid], algorithms=["RS256"], options={"verify_exp": False, "verify_aud": False})
        assert claims["iss"] == SETTINGS["SVC_ISSUER"] + "/", (name, claims)
    # The appointments page of the demo clinic: the snapshot the release built.
    status, _, page = http.call("GET", f"/v1/appointments/{seed['organization_id']}?limit=50", headers=partner)
    assert status == 200 and page["total"] == day["appointments_total"] and \
        len(page["appointments"]) == min(page["total"], 50), page
    # The chart: its download URL, and the archive behind it.
    status, _, body = http.call("GET", f"/v1/chart-retrieval/download-url/{day['chart_request_id']}", headers=partner)
    assert status == 200, body
    status, _, archive = http.call("GET", urllib.parse.urlsplit(body["download_url"]).path + "?" +
                                   urllib.parse.urlsplit(body["download_url"]).query, raw=True)
    assert status == 200 and archive[:2] == b"PK", archive[:200]
    if "developer console" not in lacks:  # console sign-in with the password set in the release
        status, _, page = http.call("GET", "/console/login")
        assert status == 200, page
        status, headers, page = http.call("POST", "/console/login", form={
            "email": day["console"]["email"], "password": day["console"]["password"], "totp_code": "",
            "_xsrf": form_xsrf(page)})
        assert status == 303, page
    # The invitation the partner sent still opens (and signs the new user in to the sandbox hub).
    status, headers, body = http.call("GET", urllib.parse.urlsplit(day["invitation"]["invitation_url"]).path)
    assert status == 302 and urllib.parse.urlsplit(headers["Location"]).path == "/sandbox/hub", (status, body)


@pytest.mark.parametrize("commit", ROLLING)
def test_the_previous_release_runs_on_the_upgraded_schema(commit, backend, tmp_path, scratch_database):
    url, env, day = restore(commit, backend, tmp_path, scratch_database)
    assert svc_auth(env, "db", "migrate").returncode == 0
    previous = ReleaseCode(ReleaseCode.extract(commit, tmp_path / "code"), tmp_path, env)
    org = json.loads(previous.cli("orgs", "create", "--name", "Rolling Clinic", "--json"))["id"]
    user = json.loads(previous.cli("users", "create", "--org", org, "--email", "roll@clinic.example", "--given-name",
                                   "Ro", "--family-name", "Ling", "--ehr-username", "rling", "--npi", "1245319599",
                                   "--json"))["id"]
    app = json.loads(previous.cli("apps", "create", "--name", "Rolling App", "--redirect-uri", "https://roll.example/cb",
                                  "--launch-url", "https://roll.example/launch", "--json"))
    previous.cli("installs", "create", "--app", app["application_id"], "--org", org)
    sandbox = previous.cli("sandbox", "token", "--user", user).strip()
    port = free_port()
    proc = previous.serve(port)
    try:  # the previous release's launch and code exchange write launches, codes and authorizations
        http = LiveHttp(f"http://127.0.0.1:{port}")
        status, _, body = http.call("POST", "/v1/sandbox/launches", {"client_id": app["client_id"]},
                                    headers={"Authorization": f"Bearer {sandbox}"})
        assert status == 201, body
        query = {"client_id": app["client_id"], "redirect_uri": "https://roll.example/cb", "response_type": "code",
                 "launch_id": body["launch_id"], "scope": "openid"}
        status, headers, body = http.call("GET", "/v1/oauth/authorize?" + urllib.parse.urlencode(query))
        assert status == 302, body
        code = urllib.parse.parse_qs(urllib.parse.urlsplit(headers["Location"]).query)["code"][0]
        status, _, tokens = http.call("POST", "/v1/oauth/token", {
            "grant_type": "authorization_code", "client_id": app["client_id"], "client_secret": app["client_secret"],
            "code": code})
        assert status == 200 and tokens["id_token"], tokens
        # The platform verifies the token (the first SDK initialization: Disabled), the app enables
        # itself, and the platform verifies it again (a paid plan): the previous release bills the user
        # into the ledger migration 5501 rebuilt (no foreign keys; two NULLable columns it leaves out).
        for status_before in (None, "Enabled"):
            if status_before:
                previous.cli("installs", "update", "--app", app["application_id"], "--org", org, "--status",
                             status_before)
            status, _, body = http.call("POST", "/v1/oauth/introspect", {"token": tokens["access_token"]},
                                        headers={"Authorization": f"Bearer {sandbox}"})
            assert status == 200 and body["active"] is True, body
    finally:
        stop_process(proc)
    shown = svc_auth(env, "orgs", "show", "--org", org, "--json")  # and the current code reads what it wrote
    assert shown.returncode == 0 and json.loads(shown.stdout)["users"] == [user], shown.stdout + shown.stderr
    [(month,)] = run_sql(url, 'SELECT "month" FROM "billable_use" WHERE "application_id" = %s',
                         (app["application_id"],))
    assert json.loads(previous.cli("billing", "report", "--month", month))["total_billable_users"] == 1  # its report
    billed = [(g["organization_name"], u["user_id"], u["email"])
              for g in ledger(env, month, app["application_id"])["organizations"] for u in g["users"]]
    assert billed == [("Rolling Clinic", user, "roll@clinic.example")], billed
    assert svc_auth(env, "apps", "delete", "--app", app["application_id"], "--yes").returncode == 0
    assert ledger(env, month, app["application_id"])["total_billable_users"] == 1


def ledger(env: dict, month: str, app: str | None = None) -> dict:
    """The current code's `billing report --month MONTH [--app APP]` (JSON)."""
    report = svc_auth(env, "billing", "report", "--month", month, "--format", "json", *(["--app", app] if app else []))
    assert report.returncode == 0, report.stderr
    return json.loads(report.stdout)


def run_sql(url: str, statement: str, params: tuple = ()) -> list:
    """One statement with plain SQL (SQLite path URL or PostgreSQL), committed; its rows, if any."""
    if url.startswith("sqlite"):
        import sqlite3
        con = sqlite3.connect(url[len("sqlite:///"):])
        try:
            rows = con.execute(statement.replace("%s", "?"), params).fetchall()
            con.commit()
            return rows
        finally:
            con.close()
    import psycopg2
    con = psycopg2.connect(url)
    try:
        with con, con.cursor() as cur:
            cur.execute(statement, params)
            return cur.fetchall() if cur.description else []
    finally:
        con.close()


def test_an_upgrade_keeps_the_billing_ledger_and_deletions_keep_it_after(backend, tmp_path, scratch_database):
    """Migration 5501 keeps every ledger row (id and values) while it removes the foreign keys that
    cascaded an app's, a clinic's or a user's deletion into the ledger; it copies the names the
    report prints into the rows; and the unique index that bills a user once a month stays."""
    url, env, day = restore(RELEASES[-1], backend, tmp_path, scratch_database)
    seed = day["seed"]
    written = [(7, seed["application_id"], seed["organization_id"], seed["physician_user_id"], "2026-10"),
               (8, seed["application_id"], seed["organization_id"], seed["other_user_id"], "2026-11")]
    for row in written:
        run_sql(url, 'INSERT INTO "billable_use" ("id", "application_id", "organization_id", "user_id", "month", '
                     '"first_verified_at") VALUES (%s, %s, %s, %s, %s, \'2026-10-05 09:30:00\')', row)
    [(clinic,)] = run_sql(url, 'SELECT "name" FROM "organization" WHERE "id" = %s', (seed["organization_id"],))
    emails = dict(run_sql(url, 'SELECT "id", "email" FROM "user"'))
    migrated = svc_auth(env, "db", "migrate")
    assert migrated.returncode == 0 and "migration 5501" in migrated.stdout, migrated.stdout + migrated.stderr
    rows = run_sql(url, 'SELECT "id", "application_id", "organization_id", "user_id", "month", "organization_name", '
                        '"user_email" FROM "billable_use" ORDER BY "id"')
    assert [tuple(r) for r in rows] == [(*row, clinic, emails[row[3]]) for row in written], rows
    from models.db import open_database
    db = open_database(url, max_connections=1)
    try:
        assert db.get_foreign_keys("billable_use") == []
        assert {i.name: (i.columns, i.unique) for i in db.get_indexes("billable_use")
                if i.name.startswith("billable_use_application_id_organization")} == {
            "billable_use_application_id_organization_id_user_id_month": (
                ["application_id", "organization_id", "user_id", "month"], True)}
    finally:
        db.close()
    # The app is deleted, then the clinic (with its users, as `demo seed --reset` does): every row stays,
    # with the names copied by the migration.
    assert svc_auth(env, "apps", "delete", "--app", seed["application_id"], "--yes").returncode == 0
    reset = svc_auth(env, "demo", "seed", "--reset")
    assert reset.returncode == 0, reset.stderr
    assert run_sql(url, 'SELECT COUNT(*) FROM "billable_use"') == [(2,)]
    for _, app_id, org_id, user_id, month in written:
        report = ledger(env, month)
        assert [(g["application_id"], g["organization_id"], g["organization_name"], u["user_id"], u["email"])
                for g in report["organizations"] for u in g["users"]] == [
            (app_id, org_id, clinic, user_id, emails[user_id])], report


def hold_the_migration_lock(backend: str, url: str):
    """Take the runner's lock as `models.schema.migration_lock` does; returns (release(), waiters())."""
    from models.schema import MIGRATION_LOCK_KEY
    if backend == "sqlite":
        import fcntl
        lock = open(url[len("sqlite:///"):] + ".migrate-lock", "a")
        fcntl.flock(lock, fcntl.LOCK_EX)
        inode = os.fstat(lock.fileno()).st_ino

        def waiters(pids) -> int:  # these processes' blocked flock()s on the file: `->` lines of /proc/locks
            lines = [line.split() for line in Path("/proc/locks").read_text().splitlines() if "->" in line]
            return sum(1 for f in lines if f[-3].endswith(f":{inode}") and int(f[-4]) in pids)
        return lock.close, waiters
    import psycopg2
    con = psycopg2.connect(url)
    con.autocommit = True
    con.cursor().execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))

    def waiters(pids) -> int:
        with con.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND "
                        "database = (SELECT oid FROM pg_database WHERE datname = current_database())")
            return cur.fetchone()[0]
    return con.close, waiters


def test_two_migrators_at_once_migrate_once(backend, tmp_path, scratch_database):
    url, env, day = restore("8cb07c3", backend, tmp_path, scratch_database)
    release, waiters = hold_the_migration_lock(backend, url)
    try:
        procs = [subprocess.Popen([sys.executable, "-m", "cli", "db", "migrate"], cwd=str(ROOT), env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        pids = {proc.pid for proc in procs}

        def both_wait() -> bool:
            gone = [proc for proc in procs if proc.poll() is not None]
            assert not gone, [proc.communicate() for proc in gone]  # a migrator that ended before the lock: why
            return waiters(pids) == 2
        wait_until(both_wait, what="both migrators waiting for the lock")
    finally:
        release()
    outputs = [proc.communicate(timeout=300) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    migrated = [out for out, _ in outputs if "migration 2651" in out]
    assert len(migrated) == 1 and "schema is up to date" in "".join(out for out, _ in outputs), outputs
    assert (BACKUP_LINE.search(migrated[0]) is not None) == (backend == "sqlite")
    after = table_counts(url)
    assert {t: after[t] for t in day["counts"] if t not in BOOKKEEPING} == \
        {t: n for t, n in day["counts"].items() if t not in BOOKKEEPING}


def test_auto_migrate_off_refuses_a_pending_schema(backend, tmp_path, scratch_database, redis_namespace):
    url, env, day = restore("8cb07c3", backend, tmp_path, scratch_database)
    env.update(SVC_AUTO_MIGRATE="off", SVC_REDIS_URL=REDIS_URL, SVC_REDIS_NAMESPACE=redis_namespace)
    status = svc_auth(env, "db", "status", "--json")
    assert status.returncode == 3, status.stderr
    found = json.loads(status.stdout)
    assert found["schema"] == 2101 and found["code"] >= 3601 and {"table": "disclosure_record"} in found["pending"] \
        and 2651 in [step.get("migration") for step in found["pending"]], found
    for command in (["serve", "--port", str(free_port())], ["worker"], ["scheduler", "--once"]):
        refused = svc_auth(env, *command)
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode != 0 and len(lines) == 1 and "svc-auth db migrate" in lines[0], refused.stderr
    assert table_counts(url) == day["counts"]  # nothing was touched
    assert svc_auth(env, "db", "migrate").returncode == 0
    assert svc_auth(env, "db", "status").returncode == 0
    port = free_port()
    stop_process(start_process(["serve", "--port", str(port)], env, port, log_path=tmp_path / "serve.log"))


def test_the_version_is_the_newest_release_of_the_changelog():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## (\d+\.\d+\.\d+)(?: \((\w+), )?", changelog, re.M)
    printed = subprocess.run([sys.executable, "-m", "cli", "--version"], cwd=str(ROOT), capture_output=True, text=True)
    assert printed.stdout.strip() == f"svc-auth {releases[0][0]}", (printed.stdout, releases[:2])
    assert re.search(rf'version="{re.escape(releases[0][0])}"', (ROOT / "setup.py").read_text())
    assert "## Unreleased" in changelog.split(f"## {releases[0][0]}")[0]  # where merged work goes
    fixtures = dict(line.split() for line in (FIXTURES / "releases.txt").read_text().splitlines()
                    if line.strip() and not line.startswith("#"))
    assert {commit: version for version, commit in releases if commit in fixtures} == \
        {commit: version for commit, version in fixtures.items()}


def columns_of(url: str) -> dict:
    """{(table, column): ColumnMetadata} of a database, through Peewee's introspection."""
    from models.db import open_database
    db = open_database(url, max_connections=1)
    try:
        return {(table, column.name): column for table in db.get_tables() for column in db.get_columns(table)}
    finally:
        db.close()


def test_what_an_upgrade_adds_to_a_table_the_previous_release_can_live_with(backend, tmp_path, scratch_database):
    """The rolling-upgrade rule (docs/operations.md): a column the migrations add to a table the
    previous release has is NULLable or has a DEFAULT in the database, or its inserts would fail."""
    url, env, day = restore(RELEASES[-1], backend, tmp_path, scratch_database)
    before = columns_of(url)
    assert svc_auth(env, "db", "migrate").returncode == 0
    old_tables = {table for table, _ in before}
    added = {key: column for key, column in columns_of(url).items() if key not in before and key[0] in old_tables}
    assert not [key for key, column in added.items() if not column.null and column.default is None], added


def test_an_sqlite_migration_that_would_break_a_reference_changes_nothing(tmp_path, scratch_database):
    """SQLite runs the steps with foreign keys off: `PRAGMA foreign_key_check` must be clean before
    the commit, else everything rolls back and `db migrate` says so in one line."""
    import sqlite3
    url, env, day = restore("8cb07c3", "sqlite", tmp_path, scratch_database)
    con = sqlite3.connect(tmp_path / "svc.db")  # Python's sqlite3 leaves foreign keys off
    con.execute("""UPDATE "user" SET organization_id = 'org_gone' WHERE id = ?""", (day["seed"]["other_user_id"],))
    con.commit()
    con.close()
    before = table_counts(url)
    refused = svc_auth(env, "db", "migrate")
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 1 and len(lines) == 1 and "rolled back, nothing changed" in lines[0], refused.stderr
    assert table_counts(url) == before
    assert json.loads(svc_auth(env, "db", "status", "--json").stdout)["schema"] == 2101


# A `db migrate` killed (SIGKILL: a deploy's timeout, an OOM kill) inside a migration loses nothing.
#
# The previous release's database gets a ledger big enough that migration 5501 (SQLite: rebuild
# `billable_use`, copy every row, drop the old table, rename; PostgreSQL: drop its foreign keys, add two
# columns, rewrite every row with the names) takes a while; `svc-auth db migrate` runs as a child
# process and is killed while it is provably inside that migration:
#
# - SQLite: the write-ahead log has grown past what the small tables' steps could write (the rebuild's
#   pages spill into it before the commit), the backup copy is written, and no version row is committed;
# - PostgreSQL: the child's server process holds the runner's advisory lock and is running the
#   migration's `UPDATE "billable_use"` (`pg_locks`, `pg_stat_activity`).
#
# After the kill the database is still the previous release's (schema number, every row). A second
# `db migrate` then migrates it: the newest schema number, every ledger row with its id and values (and
# the copied names), every other table's rows, `db status` clean, and a `serve` starts and answers as
# the upgrade tests check. Two more kills: a PostgreSQL migrator waiting for a table lock (its server
# process must end with it) and an SQLite migrator copying its backup (no partial file under a backup's name).

MONTHS_PER_USER = 20_000
"""Ledger rows per user of the fixture (three users): enough that 5501 runs for a second or more."""

LEDGER = ('SELECT "id", "application_id", "organization_id", "user_id", "month", "first_verified_at" '
          'FROM "billable_use" ORDER BY "id"')


def fill_the_ledger(backend: str, url: str, seed: dict) -> None:
    """MONTHS_PER_USER rows for each user of the seed clinic and app (months 1000-01, 1000-02, ...)."""
    users = (seed["physician_user_id"], seed["other_user_id"])
    [(third,)] = run_sql(url, 'SELECT "id" FROM "user" WHERE "id" NOT IN (%s, %s)', users)
    if backend == "sqlite":
        series = (f'WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < {MONTHS_PER_USER}) '
                  f'SELECT printf(\'%04d-%02d\', 1000 + i / 12, i % 12 + 1), '
                  f'datetime(\'2026-01-01\', \'+\' || i || \' seconds\') FROM n')
    else:
        series = (f'SELECT to_char(1000 + i / 12, \'FM0000\') || \'-\' || to_char(i %% 12 + 1, \'FM00\'), '
                  f'TIMESTAMP \'2026-01-01\' + i * INTERVAL \'1 second\' FROM generate_series(0, {MONTHS_PER_USER - 1}) i')
    for user in (*users, third):
        run_sql(url, f'INSERT INTO "billable_use" ("application_id", "organization_id", "user_id", "month", '
                     f'"first_verified_at") SELECT %s, %s, %s, m.* FROM ({series}) m',
                (seed["application_id"], seed["organization_id"], user))


def in_the_migration(backend: str, url: str, small: int):
    """A check that `db migrate` is inside migration 5501 (not committed: the caller checks after the
    kill), returning what it saw. SQLite: the write-ahead log holds more than `small` (four times the
    size of every table but the ledger: what the other steps could write) and the backup is written."""
    if backend == "sqlite":
        path = Path(url[len("sqlite:///"):])

        def check():
            wal = path.with_name(path.name + "-wal")
            size = wal.stat().st_size if wal.exists() else 0
            backups = list(path.parent.glob(path.name + ".schema-*.bak"))
            return size > small and backups and {"wal_bytes": size, "backup": str(backups[0])}
        return check
    import psycopg2
    con = psycopg2.connect(url)
    con.autocommit = True

    def check():
        with con.cursor() as cur:
            cur.execute("SELECT a.pid, a.query FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid "
                        "WHERE a.datname = current_database() AND a.state = 'active' AND l.locktype = 'advisory' "
                        "AND l.granted AND a.query LIKE 'UPDATE \"billable_use\"%%' AND a.pid <> pg_backend_pid()")
            row = cur.fetchone()
        return row and {"server_pid": row[0], "query": row[1][:80]}
    check.close = con.close
    return check


def committed_schema(url: str) -> int:
    return run_sql(url, 'SELECT MAX("version") FROM "schema_version"')[0][0]


def test_a_migrate_killed_inside_a_migration_loses_nothing(backend, tmp_path, scratch_database):
    url, env, day = restore(RELEASES[-1], backend, tmp_path, scratch_database)
    small = 4 * (tmp_path / "svc.db").stat().st_size if backend == "sqlite" else 0
    fill_the_ledger(backend, url, day["seed"])
    before_schema = committed_schema(url)
    before_counts = table_counts(url)
    ledger = [tuple(map(str, row)) for row in run_sql(url, LEDGER)]
    assert len(ledger) == 3 * MONTHS_PER_USER

    child = subprocess.Popen([sys.executable, "-m", "cli", "db", "migrate"], cwd=str(ROOT), env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    check = in_the_migration(backend, url, small)
    try:
        def inside():
            if child.poll() is not None:
                raise AssertionError(f"db migrate ended before it was killed: {child.communicate()}")
            return check()
        deadline, seen = time.monotonic() + 60, None
        while not seen and time.monotonic() < deadline:  # polled fast: the migration lasts about a second
            seen = inside()
            time.sleep(0.005)
        assert seen, "db migrate never seen inside migration 5501"
        os.kill(child.pid, signal.SIGKILL)
        child.communicate()
        assert child.returncode == -signal.SIGKILL
        if backend == "postgresql":  # the server notices the client is gone, rolls back, and ends
            wait_until(lambda: not run_sql(url, "SELECT 1 FROM pg_stat_activity WHERE pid = %s",
                                           (seen["server_pid"],)), what="the killed migrator's server process ending")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        getattr(check, "close", lambda: None)()

    # The kill landed before the commit: the database is the previous release's, every row.
    assert committed_schema(url) == before_schema, seen
    assert table_counts(url) == before_counts, seen
    assert [tuple(map(str, row)) for row in run_sql(url, LEDGER)] == ledger

    again = svc_auth(env, "db", "migrate")
    assert again.returncode == 0 and "migration 5501" in again.stdout, again.stdout + again.stderr
    status = svc_auth(env, "db", "status", "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    found = json.loads(status.stdout)
    assert found["pending"] == [] and found["schema"] == found["code"], found
    after = table_counts(url)
    assert {t: n for t, n in after.items() if t in before_counts and t not in BOOKKEEPING} == \
        {t: n for t, n in before_counts.items() if t not in BOOKKEEPING}
    assert [tuple(map(str, row)) for row in run_sql(url, LEDGER)] == ledger
    names = run_sql(url, 'SELECT COUNT(*) FROM "billable_use" WHERE "organization_name" IS NULL OR "user_email" IS NULL')
    assert names == [(0,)]
    if backend == "sqlite":
        assert run_sql(url, "PRAGMA integrity_check") == [("ok",)]
        assert run_sql(url, "PRAGMA foreign_key_check") == []
    assert "billable_use_before_5501" not in table_counts(url)

    serve_works_as_before(env, day, tmp_path)



def test_a_migrate_killed_while_it_waits_for_a_lock_leaves_no_server_process_behind(tmp_path, scratch_database):
    """PostgreSQL: a migration waiting for a table lock (a long transaction of a running `serve` reads the
    ledger) is killed, as a deploy's timeout would. Its server process must end with it: left behind, it
    would keep waiting in the lock queue, holding the runner's advisory lock (the next `db migrate`,
    and every `serve` starting with auto-migrate, wait for it) and its own locks (every later query of
    the ledger queues behind it) until that transaction ends. The runner asks the server to check its
    client every second (`client_connection_check_interval`)."""
    import psycopg2
    url, env, day = restore(RELEASES[-1], "postgresql", tmp_path, scratch_database)
    reader = psycopg2.connect(url)  # a long transaction that has read the ledger: ACCESS SHARE until it ends
    reader.cursor().execute('SELECT COUNT(*) FROM "billable_use"')
    watcher = psycopg2.connect(url)
    watcher.autocommit = True
    child = subprocess.Popen([sys.executable, "-m", "cli", "db", "migrate"], cwd=str(ROOT), env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def waiting():
            if child.poll() is not None:
                raise AssertionError(f"db migrate ended before it was killed: {child.communicate()}")
            with watcher.cursor() as cur:
                cur.execute("SELECT a.pid FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid "
                            "WHERE a.datname = current_database() AND a.wait_event_type = 'Lock' "
                            "AND a.query LIKE 'ALTER TABLE \"billable_use\"%%' AND l.locktype = 'advisory' "
                            "AND l.granted")
                row = cur.fetchone()
            return row and row[0]
        server_pid = wait_until(waiting, what="db migrate waiting for the ledger's lock in migration 5501")
        os.kill(child.pid, signal.SIGKILL)
        child.communicate()

        def ended():
            with watcher.cursor() as cur:
                cur.execute("SELECT COUNT(*) FROM pg_stat_activity WHERE pid = %s", (server_pid,))
                return cur.fetchone()[0] == 0
        wait_until(ended, timeout=10, what="the killed migrator's server process ending (the reader still reads)")
        with watcher.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
                        "(SELECT oid FROM pg_database WHERE datname = current_database())")
            assert cur.fetchone()[0] == 0  # the runner's lock is free
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        reader.close()
        watcher.close()
    assert committed_schema(url) == 2903
    again = svc_auth(env, "db", "migrate")
    assert again.returncode == 0 and "migration 5501" in again.stdout, again.stdout + again.stderr
    assert table_counts(url)["billable_use"] == day["counts"]["billable_use"]


def test_a_migrate_killed_while_it_writes_the_sqlite_backup_leaves_no_partial_backup(tmp_path, scratch_database):
    """SQLite: `db migrate` first copies the database to `<file>.schema-N.<time>.bak`. Killed while it
    copies, it must not leave a file of that name that is not the whole database (an operator would
    restore it): the copy is written as `….bak.partial` and renamed when complete. The next run
    deletes the partial copy, writes its own and migrates."""
    url, env, day = restore(RELEASES[-1], "sqlite", tmp_path, scratch_database)
    fill_the_ledger("sqlite", url, day["seed"])
    before = table_counts(url)
    database = tmp_path / "svc.db"
    child = subprocess.Popen([sys.executable, "-m", "cli", "db", "migrate"], cwd=str(ROOT), env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def copying():  # a copy beside the database, not yet the database's size
            if child.poll() is not None:
                raise AssertionError(f"db migrate ended before it was killed: {child.communicate()}")
            copies = [p for p in tmp_path.glob("svc.db.schema-*") if not p.name.endswith("-journal")]
            return [p for p in copies if p.stat().st_size < database.stat().st_size]
        deadline, seen = time.monotonic() + 60, None
        while not seen and time.monotonic() < deadline:
            seen = copying()
            time.sleep(0.002)
        assert seen, "db migrate never seen writing its backup"
        os.kill(child.pid, signal.SIGKILL)
        child.communicate()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert committed_schema(url) == 2903 and table_counts(url) == before
    backups = sorted(tmp_path.glob("svc.db.schema-*.bak"))
    assert not backups or table_counts(f"sqlite:///{backups[0]}") == before, \
        f"killed while copying {seen[0].name}, {backups[0].name} is not the whole database"
    assert sorted(p.name for p in tmp_path.glob("svc.db.schema-*.bak.partial")) == [seen[0].name], seen

    again = svc_auth(env, "db", "migrate")
    assert again.returncode == 0 and "migration 5501" in again.stdout, again.stdout + again.stderr
    backup = BACKUP_LINE.search(again.stdout)
    assert backup and table_counts(f"sqlite:///{backup.group(1)}") == before, again.stdout
    assert not list(tmp_path.glob("svc.db.schema-*.partial*")), list(tmp_path.iterdir())
