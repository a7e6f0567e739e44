"""docs/bulk-data.md's Python client, run as written against a live service: a new partner's
backend exports, polls, downloads and deletes with nothing but that page (issue 48 item 6)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from helpers.bulk import Backend, schedule_patients, sync_window_closed_now
from helpers.r4 import r4_problems
from models.bulk import BulkExport

DOC = Path(__file__).resolve().parent.parent / "docs" / "bulk-data.md"
pytestmark = pytest.mark.svc_settings(sync_window=sync_window_closed_now())  # the night never replaces a test's schedule


def the_client() -> str:
    """The first Python block of "Export, poll, download: in Python" in docs/bulk-data.md."""
    section = DOC.read_text().split("### Export, poll, download: in Python", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_documented_python_backend_exports_end_to_end(live, runtime, world, tmp_path):
    patients = schedule_patients(world.org, world.physician, world.app, 3)
    backend = Backend(runtime, live, world.org)
    key = tmp_path / "backend-key.pem"
    key.write_bytes(backend.pair.private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    script = tmp_path / "export.py"
    script.write_text(the_client())
    out = tmp_path / "export"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, env={
        "FHIR_BASE": f"{live}/fhir/r4/{world.org.id}", "CLIENT_ID": backend.app.client_id, "KEY_ID": backend.pair.kid,
        "PRIVATE_KEY_PEM": str(key), "OUT_DIR": str(out), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    files = sorted(out.glob("*.ndjson"))
    assert [f.name.split("-", 1)[1] for f in files] == ["Patient.ndjson", "Condition.ndjson", "Observation.ndjson"]
    resources = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    assert sorted(r["id"] for r in resources if r["resourceType"] == "Patient") == sorted(patients)
    assert [p for p in r4_problems(resources[:60]) if p] == []
    assert BulkExport.select().count() == 0  # the script's DELETE
