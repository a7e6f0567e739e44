"""An earlier release's code (tests/fixtures/releases), run as `svc-auth`, and what a database holds."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers.environment import ROOT
from helpers.processes import wait_for_port

RELEASE_FIXTURES = ROOT / "tests" / "fixtures" / "releases"


def table_counts(database_url: str) -> dict[str, int]:
    """Rows per table of a database (SQLite path URL or PostgreSQL), read with plain SQL."""
    if database_url.startswith("sqlite"):
        import sqlite3
        con = sqlite3.connect(database_url[len("sqlite:///"):])
        try:
            tables = [r[0] for r in con.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
            return {t: con.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0] for t in tables}
        finally:
            con.close()
    import psycopg2
    con = psycopg2.connect(database_url)
    try:
        with con.cursor() as cur:
            cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            counts = {}
            for (table,) in cur.fetchall():
                cur.execute(f'SELECT COUNT(*) FROM "{table}"')
                counts[table] = cur.fetchone()[0]
            return counts
    finally:
        con.close()


class ReleaseCode:
    """An earlier release's own code (`git archive COMMIT`), run as `svc-auth` with this venv's
    python (PYTHONPATH=the archive) against `database_url`, with `env` (the SVC_* settings)."""

    def __init__(self, code: Path, workdir: Path, env: dict):
        self.code, self.workdir, self.env = code, workdir, {**env, "PYTHONPATH": str(code)}

    @staticmethod
    def extract(commit: str, target: Path) -> Path:
        """The release's tree at `target` (made), from this repository's history."""
        target.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
        return target

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cli", *args], cwd=self.workdir, env=self.env,
                              capture_output=True, text=True, timeout=300)

    def cli(self, *args: str) -> str:
        """`svc-auth ARGS` of the release: its stdout (a non-zero exit raises, with its stderr)."""
        result = self.run(*args)
        if result.returncode != 0:
            raise RuntimeError(f"svc-auth {' '.join(args)}: exit {result.returncode}\n{result.stderr[-3000:]}")
        return result.stdout

    def serve(self, port: int):
        """The release's `serve --port PORT`, listening (stop it with `stop_process`)."""
        log = open(self.workdir / f"serve-{port}.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "cli", "serve", "--port", str(port)], cwd=self.workdir,
                                env=self.env, stdout=log, stderr=subprocess.STDOUT)
        wait_for_port(port, timeout=120, proc=proc)
        return proc
