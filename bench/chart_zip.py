"""Chart ZIP: MB/s of the real builder (`workers.chart_archive.write_chart_zip`) on a large chart,
against pyzipper alone (AES-256, deflate) on the same PDF and JSON bytes, and peak memory.

Each measurement runs in a fresh subprocess (`python -m bench.chart_zip --child ...`) so its peak
RSS (VmHWM) is its own; the figure reported is the peak minus the RSS just before building
(the interpreter, imports and the chart's generator). The chart is synthetic but not repetitive
(seeded random clinical words), so deflate cannot shrink it to nothing.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORDS = ("patient reports improved sleep appetite stable mild moderate severe pain left right knee lower back "
         "blood pressure glucose reviewed counseled diet exercise medication adherence follow labs ordered "
         "normal abnormal chest clear heart regular rhythm abdomen soft tender swelling noted denies fever "
         "cough headache dizziness nausea plan continue increase decrease dose refer physical therapy "
         "cardiology imaging xray mri ultrasound return weeks months call worse emergency education").split()
ENCOUNTER_BYTES = 1100  # roughly, in the JSON


def synthetic_chart(megabytes: float):
    from connectors import Chart, Encounter, Patient
    count = int(megabytes * 1_000_000 / ENCOUNTER_BYTES)

    def encounters():
        rng = random.Random(7)
        day = dt.date(2000, 1, 1)
        for i in range(count):
            note = lambda n: " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."  # noqa: E731
            yield Encounter(date=day + dt.timedelta(days=i // 3), encounter_type=rng.choice(
                                ["Follow-up", "Annual physical", "Acute visit", "Telehealth"]),
                            provider=f"Dr. Provider {i % 17}", reason=note(6),
                            vitals={"bp": f"{rng.randint(105, 150)}/{rng.randint(65, 95)}",
                                    "pulse": rng.randint(55, 100), "weight_kg": round(rng.uniform(50, 120), 1)},
                            assessment=note(70), plan=note(50))
    return Chart(patient=Patient(id="pat-bench", first_name="Bench", last_name="Patient",
                                 date_of_birth=dt.date(1960, 2, 29), sex="female"),
                 organization_name="Bench Clinic", encounter_source=encounters), count


def _rss_mb() -> float:
    """Peak RSS of this process image (VmHWM). Not `ru_maxrss`: after fork+exec that keeps the
    parent's RSS at the fork, which is larger than anything the chart build reaches."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(mode: str, megabytes: float, directory: str) -> dict:
    """One measurement in this (fresh) process."""
    import pyzipper
    from workers import chart_archive
    chart, count = synthetic_chart(megabytes)
    before = _rss_mb()
    if mode == "builder":
        started = time.perf_counter()
        path = chart_archive.write_chart_zip(chart, "req_bench", "bench-password", directory)
        seconds = time.perf_counter() - started
        return {"mode": mode, "encounters": count, "seconds": round(seconds, 2),
                "zip_bytes": os.path.getsize(path), "rss_before_mb": round(before, 1),
                "peak_growth_mb": round(_rss_mb() - before, 1)}
    pdf_path, json_path = os.path.join(directory, "req_bench.pdf"), os.path.join(directory, "req_bench.json")
    if mode == "render":  # the builder's two files, for the pyzipper-alone child
        chart_archive.write_chart_pdf(chart, "req_bench", pdf_path)
        chart_archive.write_chart_json(chart, "req_bench", json_path)
        return {"mode": mode}
    # pyzipper alone, in a fresh process: the same PDF and JSON bytes, zipped as the builder does.
    size = os.path.getsize(pdf_path) + os.path.getsize(json_path)
    before = _rss_mb()
    started = time.perf_counter()
    zip_path = os.path.join(directory, "alone.zip")
    with pyzipper.AESZipFile(zip_path, "w", compression=pyzipper.ZIP_DEFLATED, encryption=pyzipper.WZ_AES) as archive:
        archive.setpassword(b"bench-password")
        archive.setencryption(pyzipper.WZ_AES, nbits=256)
        archive.write(pdf_path, "req_bench.pdf")
        archive.write(json_path, "req_bench.json")
    seconds = time.perf_counter() - started
    return {"mode": mode, "encounters": count, "seconds": round(seconds, 2), "chart_bytes": size,
            "pdf_bytes": os.path.getsize(pdf_path), "json_bytes": os.path.getsize(json_path),
            "zip_bytes": os.path.getsize(zip_path), "rss_before_mb": round(before, 1),
            "peak_growth_mb": round(_rss_mb() - before, 1)}


def _child(mode: str, megabytes: float, directory: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "bench.chart_zip", "--child", mode, "--megabytes", str(megabytes),
                          "--dir", directory], cwd=str(ROOT), capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"chart benchmark child failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(mode: str, megabytes: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-chart-") as directory:
        if mode == "pyzipper":
            _child("render", megabytes, directory)
        return _child(mode, megabytes, directory)


def chart_zip_benchmarks(say, sizes=(12.5, 25, 50)) -> dict:
    """Builder vs pyzipper alone at each chart size (MB of PDF + JSON); the last size is the headline."""
    runs = []
    for megabytes in sizes:
        alone = measure("pyzipper", megabytes)
        builder = measure("builder", megabytes)
        mb = alone["chart_bytes"] / 1e6
        run = {"target_mb": megabytes, "chart_mb": round(mb, 1), "pdf_mb": round(alone["pdf_bytes"] / 1e6, 1),
               "json_mb": round(alone["json_bytes"] / 1e6, 1), "encounters": builder["encounters"],
               "builder_seconds": builder["seconds"], "builder_mb_per_s": round(mb / builder["seconds"], 1),
               "builder_peak_growth_mb": builder["peak_growth_mb"],
               "builder_peak_rss_mb": round(builder["rss_before_mb"] + builder["peak_growth_mb"], 1),
               "pyzipper_seconds": alone["seconds"], "pyzipper_mb_per_s": round(mb / alone["seconds"], 1),
               "pyzipper_peak_growth_mb": alone["peak_growth_mb"],
               "pyzipper_peak_rss_mb": round(alone["rss_before_mb"] + alone["peak_growth_mb"], 1), "zip_mb": round(builder["zip_bytes"] / 1e6, 1)}
        runs.append(run)
        say(f"chart ZIP {run['chart_mb']} MB ({run['encounters']} encounters; PDF {run['pdf_mb']} MB, JSON "
            f"{run['json_mb']} MB): builder {run['builder_mb_per_s']} MB/s (+{run['builder_peak_growth_mb']} MB peak), "
            f"pyzipper alone {run['pyzipper_mb_per_s']} MB/s (+{run['pyzipper_peak_growth_mb']} MB peak)")
    return {"runs": runs, "headline": runs[-1]}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", choices=("builder", "render", "pyzipper"))
    parser.add_argument("--megabytes", type=float, default=50)
    parser.add_argument("--dir")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.megabytes, args.dir)))
    else:
        print(json.dumps(chart_zip_benchmarks(print), indent=2))
