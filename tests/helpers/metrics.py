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
