"""The recovery sweep's view of unfinished uploads in the local object store: a temporary file of
a build that no longer holds its lease is removed, a live build's is kept (issue 18)."""
from __future__ import annotations

import datetime as dt
import os

import pytest

from connectors.sandbox import patient_panel
from models.charts import ChartRequest
from workers.charts import chart_key
from workers.recovery import sweep_uploads


def temp_file(runtime, key: str, name: str | None = None) -> str:
    target = os.path.join(runtime.settings.objects_dir, key)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    path = os.path.join(os.path.dirname(target), name or f".{os.path.basename(target)}.k2j9x_1.part")
    with open(path, "wb") as out:
        out.write(b"half a zip")
    return path


def test_the_sweep_removes_temporary_files_of_stopped_builds_only(runtime, world):
    now = runtime.clock.now()
    panel = patient_panel(world.org.id)
    live = ChartRequest.create(application=world.app.id, organization=world.org.id, patient_id=panel[0].id,
                               lease_owner="alive", lease_until=now + dt.timedelta(seconds=60))
    dead = ChartRequest.create(application=world.app.id, organization=world.org.id, patient_id=panel[1].id,
                               lease_owner="killed", lease_until=now - dt.timedelta(seconds=1))
    kept = temp_file(runtime, chart_key(live.id))
    removed = temp_file(runtime, chart_key(dead.id))
    legacy = temp_file(runtime, chart_key(dead.id), ".upload-abc123.part")  # an older version's temporary file
    old = dt.datetime.now().timestamp() - 3600
    os.utime(legacy, (old, old))
    assert sorted(sweep_uploads(runtime)) == sorted([chart_key(dead.id), legacy])
    assert os.path.exists(kept) and not os.path.exists(removed) and not os.path.exists(legacy)
    assert sweep_uploads(runtime) == []


@pytest.mark.parametrize("key", ["charts/a.zip\n", "charts/../a.zip", ".hidden", "/abs", "a//b", "a/\x00b", ""])
def test_an_object_key_is_matched_whole(key):
    """Every store names objects only by `check_key`'s keys: a final newline (which `$` let by),
    `..`, a leading dot or slash, an empty segment or a NUL is refused."""
    from storage.keys import check_key
    with pytest.raises(ValueError):
        check_key(key)
    assert check_key("bulk/0a1b/Patient-1.ndjson") == "bulk/0a1b/Patient-1.ndjson"
