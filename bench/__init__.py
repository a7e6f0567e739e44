"""Benchmarks of svc-auth (`make bench` / `python -m bench`), run against real processes.

Every figure that is compared with another is measured in the same run, on the same machine,
one after the other, so that ratios hold even on a busy shared machine. Results go to
`bench/results/<timestamp>.json` (and `latest.json`); `BENCHMARKS.md` shows the latest run.
"""
