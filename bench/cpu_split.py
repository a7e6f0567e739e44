"""Where the CPU of a load run goes by library, from on-CPU samples (`perf record -e cpu-clock`).

py-spy samples wall time: a process that a `send` made runnable-but-preempted (the woken wrk
thread runs first) is still counted inside the send, so its profile overstates syscalls. perf's
cpu-clock event fires only while a thread is on a CPU, so its shares are CPU shares. Python 3.11
frames are invisible to perf; the split is by shared object: the RSA arithmetic (OpenSSL inside
cryptography's Rust module), the interpreter, the kernel (syscalls, TCP on loopback), libc.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

PERF = shutil.which("perf")

# (label, substrings of a perf DSO name); the first that matches wins.
GROUPS = (
    ("RSA signature and hashing (OpenSSL in cryptography's `_rust` module, libcrypto)", ("_rust.abi3", "libcrypto")),
    ("Python interpreter (libpython: bytecode, objects, dicts, allocation)", ("libpython",)),
    ("kernel (syscalls: socket send/receive, epoll, log writes; TCP on loopback)", ("[kernel",)),
    ("libc (malloc, memcpy)", ("libc.so", "libm.so")),
    ("uvloop, asyncio, json, other C extensions", (".cpython-", "[vdso]")),
)


def cpu_by_library(pids: list[int], seconds: float, workdir: Path, load) -> dict:
    """Record on-CPU samples of `pids` (every thread) for `seconds` while `load()` runs."""
    if PERF is None:
        return {"skipped": "perf is not installed (linux-perf)"}
    data = workdir / "perf.data"
    perf = subprocess.Popen([PERF, "record", "-e", "cpu-clock", "-F", "499", "-o", str(data),
                             "-p", ",".join(map(str, pids)), "--", "sleep", str(int(seconds))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    load()
    _, err = perf.communicate(timeout=seconds + 60)
    if perf.returncode != 0 or not data.exists():
        return {"skipped": f"perf failed: {err.decode(errors='replace').strip()[:300]}"}
    out = subprocess.run([PERF, "report", "-i", str(data), "--no-children", "--sort", "dso", "--stdio", "-g", "none",
                          "-n"], capture_output=True, text=True, timeout=120).stdout
    counts = {label: 0 for label, _ in GROUPS}
    counts["other"] = 0
    for line in out.splitlines():
        fields = line.split(None, 2)  # "44.71%  1254  libpython3.11.so.1.0"
        if len(fields) < 3 or line.lstrip().startswith("#") or not fields[0].endswith("%") or not fields[1].isdigit():
            continue
        label = next((label for label, needles in GROUPS if any(n in fields[2] for n in needles)), "other")
        counts[label] += int(fields[1])
    total = sum(counts.values())
    if not total:
        return {"skipped": "perf recorded no samples"}
    return {"tool": "perf record -e cpu-clock -F 499 (on-CPU samples, every thread of the serve processes)",
            "samples": total, "shares": {label: round(n / total, 3) for label, n in counts.items()}}
