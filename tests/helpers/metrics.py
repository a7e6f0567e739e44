"""Reading Prometheus text in tests."""
from __future__ import annotations

import re


def sample(metrics_text: str, name: str, **labels) -> float:
    """The value of one sample in a Prometheus text exposition (0 when absent)."""
    for line in metrics_text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line[len(name):line.rindex("}") + 1]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def requests_per_process(metrics_dir, route: str = "/healthz", status: str | None = None) -> dict[int, int]:
    """Requests to `route` (answered with `status`, if given) by each process of `serve --processes N`
    (pid), from its own sample files in `metrics_dir`."""
    from pathlib import Path

    from prometheus_client.multiprocess import MultiProcessCollector
    counts = {}
    for path in Path(metrics_dir).glob("counter_*.db"):
        pid = int(path.stem.rsplit("_", 1)[1])
        counts[pid] = sum(s.value for metric in MultiProcessCollector.merge([str(path)])
                          for s in metric.samples
                          if s.name == "svc_http_requests_total" and s.labels.get("route") == route
                          and (status is None or s.labels.get("status") == status))
    return counts
