"""`python -m bench [--seconds S] [--only SECTION ...]`: run the benchmarks, print, save, update BENCHMARKS.md.

Sections: `production` (the token endpoint in the shape operators run: `serve --processes 2` on
PostgreSQL + Redis, beside the embedded shape, wrk 32 connections, CPU of every process counted;
skipped with the reason when PostgreSQL or Redis is unreachable; with node-oidc-provider on PostgreSQL
beside it, bench/peers.py), `floor` (`/healthz` and a token per CPU-second, this checkout against
`--baseline REV` alternating, bench/floor.py), `tokens` (signing ceiling and every HTTP figure of one serve process, all in one run),
`fhir_reads` (the platform FHIR API's reads and searches per CPU-second beside `/healthz` and a token,
in both shapes, and svc-auth's CPU per read proxied to the test FHIR EHR; with `--baseline REV`, this
checkout against REV alternating, bench/fhir_reads.py), `disclosure_audit` (FHIR
reads per CPU-second with SVC_DISCLOSURE_AUDIT on and off, both shapes), `remote_db` (PostgreSQL behind a ~1 ms delay proxy vs loopback, tokens per CPU-second, py-spy profile),
`fhir_night` (100 clinics x 20 physicians on the test FHIR EHR, tests/js/fhir_ehr.mjs: appointments
per second and the EHR's share of the time; PostgreSQL), `appointments` and `snapshot` (PostgreSQL + Redis: `--postgres-url`, `--redis-url`; skipped with the
reason when unreachable), `chart` (chart ZIP) and `outage` (a PostgreSQL of its own, initdb + pg_ctl:
`/healthz` and JWKS while a request waits on a table lock; PostgreSQL stopped for 10 s under load),
`hl7_feed` (the SIU feed's listener: ACKs/s with 8 senders, PostgreSQL and embedded, as a ratio to an
empty MLLP echo; a 100,000-message backfill's memory, `BENCH_HL7_BACKFILL` to change the count; bench/hl7_feed.py). `bulk_export`
(a `Patient/$export` of a 10,000-patient sandbox clinic on a worker, Redis: time, CPU per resource against a
search page's, peak RSS of worker and serve; bench/bulk_export.py). A run of some sections keeps the other sections of
the previous `latest.json`, each with the time and load it was measured at.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import ssl
import sys
from pathlib import Path

from bench import loadgen
from bench.service import BenchService
from bench.signing import signing_ceiling

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
SIGNATURES_PER_EXCHANGE = 2  # the access token and the ID token
TARGET_RATIO = 0.6
MAIN_CONNECTIONS = 16
SWEEP = (1, 16, 64, 256)


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(), "openssl": ssl.OPENSSL_VERSION, "kernel": platform.release(),
            "wrk": loadgen.WRK}


def say(text: str) -> None:
    print(text, flush=True)


def with_cpu(service: BenchService, measure) -> dict:
    """`measure()`'s figures plus the CPU the serve process used meanwhile (cores, CPU ms per request)."""
    before = service.cpu_seconds()
    run = measure()
    used = service.cpu_seconds() - before
    run["serve_cpu_cores"] = round(used / run["seconds"], 2)
    run["serve_cpu_ms_per_request"] = round(1000 * used / max(1, run["requests"]), 3)
    return run


def token_endpoint(service: BenchService, connections: int, seconds: float) -> dict:
    return with_cpu(service, lambda: loadgen.run(service.url + "/v1/oauth/token", "post", connections, seconds, env={
        "BENCH_BODY": "grant_type=client_credentials", "BENCH_AUTHORIZATION": service.client_auth}))


def http_benchmarks(database_url: str | None, seconds: float) -> dict:
    service = BenchService(database_url).start()
    try:
        key = service.private_key
        results: dict = {"database": service.database_url.split(":", 1)[0]}
        ceiling_before = signing_ceiling(key, seconds)
        say(f"signing ceiling (before): {ceiling_before['per_second']:.0f} RS256 signatures/s on one core")

        # Warm-up (not measured): the first requests of a fresh process pay for cold caches and the
        # interpreter specialising the hot code; the sweep below showed ~15% more tokens/s than a cold run.
        token_endpoint(service, MAIN_CONNECTIONS, min(seconds, 2.0))
        cc = token_endpoint(service, MAIN_CONNECTIONS, seconds)
        say(f"client_credentials: {cc['rps']:.0f} tokens/s  p50 {cc['p50_ms']:.2f} ms  p99 {cc['p99_ms']:.2f} ms  "
            f"(serve used {cc['serve_cpu_cores']} cores, {cc['serve_cpu_ms_per_request']} CPU ms per token)")

        needed = int(cc["rps"] / SIGNATURES_PER_EXCHANGE * seconds * 2) + 500
        codes = service.mint_codes(needed)
        codes_file = service.tmp / "codes.txt"
        codes_file.write_text("\n".join(codes) + "\n")
        exchange = with_cpu(service, lambda: loadgen.run(
            service.url + "/v1/oauth/token", "codes", MAIN_CONNECTIONS, seconds, env={
                "BENCH_CODES_FILE": str(codes_file), "BENCH_AUTHORIZATION": service.client_auth}))
        exchange["codes_minted"] = len(codes)
        say(f"authorization_code: {exchange['rps']:.0f} exchanges/s  p50 {exchange['p50_ms']:.2f} ms  "
            f"p99 {exchange['p99_ms']:.2f} ms  ({len(codes)} codes minted via /oauth/authorize, "
            f"errors {exchange['errors'] or 'none'})")

        access_token = service.user_access_token()
        userinfo = loadgen.run(service.url + "/v1/oauth/userinfo", "get", MAIN_CONNECTIONS, seconds,
                               env={"BENCH_AUTHORIZATION": f"Bearer {access_token}"})
        say(f"userinfo: {userinfo['rps']:.0f} req/s  p50 {userinfo['p50_ms']:.2f} ms  p99 {userinfo['p99_ms']:.2f} ms")
        introspect = loadgen.run(service.url + "/v1/oauth/introspect", "post", MAIN_CONNECTIONS, seconds, env={
            "BENCH_BODY": f"token={access_token}", "BENCH_AUTHORIZATION": service.client_auth})
        say(f"introspection: {introspect['rps']:.0f} req/s  p50 {introspect['p50_ms']:.2f} ms  "
            f"p99 {introspect['p99_ms']:.2f} ms")
        healthz = loadgen.run(service.url + "/healthz", "get", MAIN_CONNECTIONS, seconds)
        say(f"/healthz (framework floor): {healthz['rps']:.0f} req/s  p50 {healthz['p50_ms']:.2f} ms")

        sweep = []
        for connections in SWEEP:
            run = token_endpoint(service, connections, seconds)
            sweep.append(run)
            say(f"client_credentials @ {connections:>3} connections: {run['rps']:.0f} tokens/s  "
                f"p50 {run['p50_ms']:.2f} ms  p99 {run['p99_ms']:.2f} ms  errors {run['errors'] or 'none'}")

        ceiling_after = signing_ceiling(key, seconds)
        say(f"signing ceiling (after): {ceiling_after['per_second']:.0f} RS256 signatures/s")
        ceiling = (ceiling_before["per_second"] + ceiling_after["per_second"]) / 2
        results.update({
            "signing_ceiling": {"before": ceiling_before, "after": ceiling_after, "per_second": round(ceiling, 1)},
            "client_credentials": cc, "authorization_code": exchange, "userinfo": userinfo,
            "introspection": introspect, "healthz": healthz, "client_credentials_sweep": sweep,
            "ratios": {
                "client_credentials_vs_ceiling": round(cc["rps"] / ceiling, 3),
                "authorization_code_vs_ceiling_per_exchange":
                    round(exchange["rps"] / (ceiling / SIGNATURES_PER_EXCHANGE), 3),
                "signatures_per_exchange": SIGNATURES_PER_EXCHANGE, "target": TARGET_RATIO,
            },
        })
        r = results["ratios"]
        say(f"ratio client_credentials / ceiling = {r['client_credentials_vs_ceiling']:.2f} (target {TARGET_RATIO})")
        say(f"ratio exchanges / (ceiling / {SIGNATURES_PER_EXCHANGE}) = "
            f"{r['authorization_code_vs_ceiling_per_exchange']:.2f} (target {TARGET_RATIO})")
        return results
    finally:
        service.stop()


SECTIONS = ("production", "floor", "fhir_reads", "disclosure_audit", "tokens", "remote_db", "appointments", "snapshot", "fhir_night", "chart", "outage",
            "hl7_feed", "bulk_export")


def section_header() -> dict:
    return {"started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def backends(args, need_redis: bool = True) -> str | None:
    from bench.fleet import postgres_reachable, redis_reachable
    return postgres_reachable(args.postgres_url) or (redis_reachable(args.redis_url) if need_redis else None)


def main(argv=None) -> int:
    from bench.fleet import DEFAULT_POSTGRES_URL
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each measurement")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, help="run only these sections")
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL"),
                        help="PostgreSQL URL for the token benchmarks (default: SQLite in a temp dir)")
    parser.add_argument("--postgres-url", default=os.environ.get("BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL),
                        help="PostgreSQL server for the appointments and snapshot benchmarks (a scratch "
                             "database is created there and dropped)")
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"),
                        help="Redis for rate limits and workers (keys under a random namespace, removed)")
    parser.add_argument("--baseline", default=os.environ.get("BENCH_BASELINE"),
                        help="the commit the `floor` section compares this checkout with (default: main); "
                             "given, `fhir_reads` also runs as this checkout against it, alternating")
    parser.add_argument("--no-markdown", action="store_true", help="do not rewrite BENCHMARKS.md")
    parser.add_argument("--bulk-patients", type=int, default=10_000, help="patients of the bulk_export clinic")
    args = parser.parse_args(argv)
    sections = args.only or SECTIONS
    started = dt.datetime.now(dt.timezone.utc)
    previous = {}
    if args.only and (RESULTS / "latest.json").exists():
        previous = json.loads((RESULTS / "latest.json").read_text())
    report = {**previous, "started_at": started.isoformat(timespec="seconds"), "machine": machine(),
              "seconds": args.seconds, "sections_run": list(sections)}
    report.pop("pending", None)
    say(f"machine: {report['machine']['cpu']}, {report['machine']['cores']} cores, "
        f"load {report['machine']['load_average']}")
    if "production" in sections:
        from bench.production import production_benchmarks
        header, skipped = section_header(), backends(args)
        report["production"] = {**header, "skipped": skipped} if skipped else {
            **header, **production_benchmarks(args.postgres_url, args.redis_url, args.seconds, say)}
        if skipped:
            say(f"production shape: skipped ({skipped})")
    if "floor" in sections:
        from bench.floor import floor_benchmarks
        report["floor"] = {**section_header(), **floor_benchmarks(args.baseline or "main", args.seconds, say)}
    if "fhir_reads" in sections:
        from bench.fhir_reads import fhir_reads_benchmarks
        header, skipped = section_header(), backends(args)
        report["fhir_reads"] = {**header, **fhir_reads_benchmarks(
            None if skipped else args.postgres_url, None if skipped else args.redis_url, args.seconds, say,
            baseline=args.baseline)}
        if skipped:
            report["fhir_reads"]["production_skipped"] = skipped
            say(f"FHIR reads, production shape: skipped ({skipped})")
    if "disclosure_audit" in sections:
        from bench.disclosure_audit import disclosure_audit_benchmarks
        header, skipped = section_header(), backends(args)
        report["disclosure_audit"] = {**header, **disclosure_audit_benchmarks(
            None if skipped else args.postgres_url, None if skipped else args.redis_url, args.seconds, say)}
        if skipped:
            report["disclosure_audit"]["production_skipped"] = skipped
    if "tokens" in sections:
        header = section_header()
        cap = loadgen.capacity(min(args.seconds, 3.0))
        report["load_generator_capacity"] = cap
        if cap:
            say(f"load generator: wrk drives {cap['rps']:.0f} req/s against nginx's fixed response (its ceiling here)")
        report["http"] = {**header, **http_benchmarks(args.database_url, args.seconds)}
    if "remote_db" in sections:
        from bench.remote_db import remote_database_benchmarks
        header, skipped = section_header(), backends(args, need_redis=False)
        report["remote_db"] = {**header, "skipped": skipped} if skipped else {
            **header, **remote_database_benchmarks(args.postgres_url, args.seconds, say)}
        if skipped:
            say(f"remote database: skipped ({skipped})")
    if "appointments" in sections:
        from bench.appointments import appointments_benchmarks
        header, skipped = section_header(), backends(args)
        report["appointments"] = {**header, "skipped": skipped} if skipped else {
            **header, **appointments_benchmarks(args.postgres_url, args.redis_url, args.seconds, say)}
        if skipped:
            say(f"appointments: skipped ({skipped})")
    if "snapshot" in sections:
        from bench.snapshot import snapshot_benchmarks
        header, skipped = section_header(), backends(args)
        report["nightly_snapshot"] = {**header, "skipped": skipped} if skipped else {
            **header, **snapshot_benchmarks(args.postgres_url, args.redis_url, say)}
        if skipped:
            say(f"nightly snapshot: skipped ({skipped})")
    if "fhir_night" in sections:
        from bench.fhir_night import fhir_night_benchmark
        header, skipped = section_header(), backends(args)
        report["fhir_night"] = {**header, "skipped": skipped} if skipped else {
            **header, **fhir_night_benchmark(args.postgres_url, say)}
    if "chart" in sections:
        from bench.chart_zip import chart_zip_benchmarks
        report["chart_zip"] = {**section_header(), **chart_zip_benchmarks(say)}
    if "hl7_feed" in sections:
        from bench.hl7_feed import hl7_feed_benchmarks
        header, skipped = section_header(), backends(args, need_redis=False)
        report["hl7_feed"] = {**header, **hl7_feed_benchmarks(
            None if skipped else args.postgres_url, args.seconds, say,
            backfill=int(os.environ.get("BENCH_HL7_BACKFILL", "100000")))}
        if skipped:
            report["hl7_feed"]["postgresql_skipped"] = skipped
            say(f"hl7 feed, PostgreSQL: skipped ({skipped})")
    if "bulk_export" in sections:
        from bench.bulk_export import bulk_export_benchmark
        from bench.fleet import redis_reachable
        header, skipped = section_header(), redis_reachable(args.redis_url)
        report["bulk_export"] = {**header, "skipped": skipped} if skipped else {
            **header, **bulk_export_benchmark(args.redis_url, say, args.bulk_patients)}
    if "outage" in sections:
        from bench.outage import outage_benchmarks
        report["outage"] = {**section_header(), **outage_benchmarks(say)}
    RESULTS.mkdir(exist_ok=True)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    for path in (RESULTS / f"{stamp}.json", RESULTS / "latest.json"):
        path.write_text(json.dumps(report, indent=2) + "\n")
    say(f"results: bench/results/{stamp}.json")
    if not args.no_markdown:
        from bench.markdown import update_benchmarks_md
        update_benchmarks_md(ROOT / "BENCHMARKS.md", report)
        say("BENCHMARKS.md updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
