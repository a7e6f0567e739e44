"""Where the tests run: the repository, tests/js (the npm side), the PostgreSQL and Redis they use,
and the database backends every `runtime` test runs on."""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
JS_DIR = ROOT / "tests" / "js"
PG_DSN = os.environ.get("SVC_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432")
REDIS_URL = os.environ.get("SVC_TEST_REDIS", "redis://127.0.0.1:6379/0")
BACKENDS = tuple(b for b in os.environ.get("SVC_TEST_DATABASES", "sqlite,postgresql").split(",") if b)


def database_url(backend: str, tmp_path: Path, request) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'svc.db'}"
    return request.getfixturevalue("postgres_url")
