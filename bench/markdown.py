"""Writes the latest run's figures into BENCHMARKS.md between the generated-section markers."""
from __future__ import annotations

from pathlib import Path

BEGIN, END = "<!-- bench:latest:begin -->", "<!-- bench:latest:end -->"


def _when(section: dict) -> str:
    return f"measured {section['started_at']}, load average {', '.join(map(str, section['load_average']))}"


def render_appointments(a: dict) -> list[str]:
    if a.get("skipped"):
        return [f"**Appointments page**: skipped ({a['skipped']}).", ""]
    rows = [f"**Appointments page** (`GET /v1/appointments/{{org}}` through HTTP, PostgreSQL, Redis rate limits, "
            f"{a['organizations']:,} organizations x {a['physicians_per_organization']} physicians, pages of "
            f"{a['page_size']}, wrk on {a['connections']} connection, random organizations; {_when(a)}):", "",
            "| rows | per organization | page | offset | req/s | p50 | p99 | page query in PostgreSQL (last page) |",
            "|---|---|---|---|---|---|---|---|"]
    for step in a["steps"]:
        plan = step["explain_last_page"]
        for kind, run in step["pages"].items():
            db = (f"{plan['page']['execution_ms']} ms + total {plan['total']['execution_ms']} ms"
                  if kind == "last" else "")
            rows.append(f"| {step['rows']:,} | {step['rows_per_organization']:,} | {kind} | {run['offset']} | "
                        f"{run['rps']:.0f} | {run['p50_ms']:.2f} ms | {run['p99_ms']:.2f} ms | {db} |")
    verdict = "meets" if a["worst_p99_ms"] < a["target_p99_ms"] else "**misses**"
    rows += ["", f"Worst p99 of any page: {a['worst_p99_ms']:.2f} ms (target < {a['target_p99_ms']:.0f} ms: "
                 f"{verdict}).", ""]
    return rows


def render_snapshot(s: dict) -> list[str]:
    if s.get("skipped"):
        return [f"**Nightly snapshot**: skipped ({s['skipped']}).", ""]
    rows = [f"**Nightly snapshot** ({s['organizations']:,} organizations x {s['physicians_per_organization']} "
            f"physicians, sandbox EHR, PostgreSQL, Dramatiq on Redis; {_when(s)}):", "",
            "| workers | threads each | wall time | appointments written | rows/s | organizations/s |",
            "|---|---|---|---|---|---|"]
    for run in s["runs"]:
        rows.append(f"| {run['workers']} | {run['threads_per_worker']} | {run['seconds']:.1f} s | {run['rows']:,} | "
                    f"{run['rows_per_second']:,} | {run['organizations_per_second']} |")
    return rows + [""]


def render_fhir_night(f: dict) -> list[str]:
    if f.get("skipped"):
        return [f"**FHIR night**: skipped ({f['skipped']}).", ""]
    return [f"**A night of FHIR clinics** ({f['organizations']} clinics x {f['physicians_per_organization']} physicians "
            f"on the test FHIR EHR, tests/js/fhir_ehr.mjs: Medplum's in-memory FHIR engine behind SMART Backend "
            f"Services tokens; one `snapshot run`, PostgreSQL; {_when(f)}):", "",
            "| appointments | seconds | appointments/s | FHIR requests | token requests | EHR busy | EHR share of the time |",
            "|---|---|---|---|---|---|---|",
            f"| {f['appointments']:,} | {f['seconds']} | {f['appointments_per_second']} | {f['fhir_requests']:,} | "
            f"{f['token_requests']} | {f['ehr_busy_seconds']} s | {100 * f['ehr_share']:.0f}% |", "",
            "The EHR's own busy time (measured inside it) is nearly all of the night: MemoryRepository scans every "
            "Appointment for each search (no index), so this figure measures the test EHR more than svc-auth. "
            "svc-auth's side is one Practitioner search and one paged Appointment search per physician, no query "
            "per patient, and one token per process.", ""]


def render_chart(c: dict) -> list[str]:
    rows = [f"**Chart ZIP** (AES-256 + deflate; chart = the PDF + JSON the archive holds; peak = growth of the "
            f"process's peak RSS (VmHWM) while building, fresh process each; {_when(c)}):", "",
            "| chart | encounters | PDF / JSON | builder | builder peak | pyzipper alone | pyzipper peak | ZIP |",
            "|---|---|---|---|---|---|---|---|"]
    for run in c["runs"]:
        rows.append(f"| {run['chart_mb']} MB | {run['encounters']:,} | {run['pdf_mb']} / {run['json_mb']} MB | "
                    f"{run['builder_mb_per_s']} MB/s ({run['builder_seconds']} s) | +{run['builder_peak_growth_mb']} MB "
                    f"(peak RSS {run.get('builder_peak_rss_mb', '?')} MB) | "
                    f"{run['pyzipper_mb_per_s']} MB/s ({run['pyzipper_seconds']} s) | "
                    f"+{run['pyzipper_peak_growth_mb']} MB (peak RSS {run.get('pyzipper_peak_rss_mb', '?')} MB) | "
                    f"{run['zip_mb']} MB |")
    return rows + [""]


def render_bulk_export(b: dict) -> list[str]:
    return [f"**Bulk Data export** (`Patient/$export` of a {b['patients']:,}-patient sandbox clinic, {b['types']} US Core "
            f"types; serve + one worker thread, Redis, SQLite, local store; bench/bulk_export.py; {_when(b)}):", "",
            "| resources | files | time | worker CPU / resource | search page CPU / resource | ratio | worker peak RSS | serve peak RSS |",
            "|---|---|---|---|---|---|---|---|",
            f"| {b['resources']:,} | {b['files']} | {b['seconds']} s ({b['resources_per_second']:,}/s) | "
            f"{b['worker_cpu_us_per_resource']} µs | {b['search_cpu_us_per_resource']} µs | "
            f"{b['cpu_ratio_export_to_search']} (target <= 1) | {b['worker_peak_rss_mb']} MB | {b['serve_peak_rss_mb']} MB |", ""]


def render_outage(o: dict) -> list[str]:
    locked, outage = o["locked_database"], o["postgresql_outage"]
    waited = locked["waiting_request"]
    p99 = max(locked["healthz"]["p99_ms"], locked["jwks"]["p99_ms"])
    rows = [f"**Outages** (`serve --processes 2` on a PostgreSQL of the benchmark's own; {_when(o)}):", "",
            "| figure | result | target |", "|---|---|---|",
            f"| `/healthz` and JWKS p99 while another request waits {locked['lock_seconds']:.0f} s on a table lock "
            f"({locked['healthz']['requests'] + locked['jwks']['requests']} requests; the waiting request: "
            f"{waited.get('status')} after {waited.get('seconds')} s) | `/healthz` {locked['healthz']['p99_ms']} ms, "
            f"JWKS {locked['jwks']['p99_ms']} ms (max {max(locked['healthz']['max_ms'], locked['jwks']['max_ms'])} ms)"
            f" | < 20 ms: {'meets' if p99 < 20 else '**misses**'} |"]
    kinds = outage["kinds"]
    total_500 = sum(k["status_500"] for k in kinds.values())
    recoveries = [k["first_success_after_s"] for name, k in kinds.items() if name in ("organizations", "token")]
    recovery = max(r for r in recoveries if r is not None) if all(r is not None for r in recoveries) else None
    rows += [f"| 500s while PostgreSQL is stopped for {outage['outage_seconds']:.0f} s under load | {total_500} "
             f"(503s: {sum(k['status_503'] for k in kinds.values())}, all with Retry-After: "
             f"{'yes' if not sum(k['503_without_retry_after'] for k in kinds.values()) else 'no'}) | 0: "
             f"{'meets' if total_500 == 0 else '**misses**'} |",
             f"| recovery once PostgreSQL accepts connections again (first success of each kind that needs it) | "
             f"{recovery} s | ≤ 5 s: {'meets' if recovery is not None and recovery <= 5 else '**misses**'} |", "",
             "| kind | requests | statuses | p99 |", "|---|---|---|---|"]
    for name, k in kinds.items():
        statuses = ", ".join(f"{s}: {n}" for s, n in k["statuses"].items())
        rows.append(f"| {name} | {k['requests']} | {statuses} | {k['p99_ms']} ms |")
    ready = outage["readyz"]
    rows += ["", f"`/readyz` during the outage: {ready['during'].get('status')} "
                 f"(database {ready['during'].get('checks', {}).get('database')}); after: "
                 f"{ready['after'].get('status')} (database {ready['after'].get('checks', {}).get('database')}).", ""]
    return rows


def render_remote_db(d: dict) -> list[str]:
    if d.get("skipped"):
        return [f"**PostgreSQL one round trip away**: skipped ({d['skipped']}).", ""]
    r, proxy, ceiling = d["ratios"], d["delay_proxy"], d["signing_ceiling"]
    ok = lambda value, target: "meets" if value >= target else f"**misses** by {target - value:.2f}"
    rows = [f"**PostgreSQL one round trip away** (one `serve` process, wrk at {d['connections']} connections; the "
            f"delay proxy `bench/delayproxy.py` adds {proxy['added_ms']} ms to a `SELECT 1` round trip "
            f"({proxy['direct_ms']} ms direct, {proxy['proxied_ms']} ms through it); {_when(d)}):", "",
            "| run | client_credentials/s | p99 | code exchanges/s | p99 | serve CPU s | PostgreSQL backends CPU s |",
            "|---|---|---|---|---|---|---|"]
    for label, key in (("loopback", "loopback"), (f"+{proxy['added_ms']} ms", "remote")):
        cc, ex = d[key]["client_credentials"], d[key]["authorization_code"]
        rows.append(f"| {label} | {cc['rps']:.0f} | {cc['p99_ms']:.1f} ms | {ex['rps']:.0f} | {ex['p99_ms']:.1f} ms | "
                    f"{cc['serve_cpu_seconds']} + {ex['serve_cpu_seconds']} | "
                    f"{cc['postgres_cpu_seconds']} + {ex['postgres_cpu_seconds']} |")
    cc = d["loopback"]["client_credentials"]
    rows += ["", "| ratio (one run) | measured | target | |", "|---|---|---|---|",
             f"| client_credentials, remote ÷ loopback | {r['client_credentials_remote_vs_loopback']:.2f} | ≥ 0.8 | "
             f"{ok(r['client_credentials_remote_vs_loopback'], 0.8)} |",
             f"| code exchanges, remote ÷ loopback | {r['authorization_code_remote_vs_loopback']:.2f} | ≥ 0.8 | "
             f"{ok(r['authorization_code_remote_vs_loopback'], 0.8)} |",
             f"| client_credentials tokens per CPU-second of serve + PostgreSQL backends ({cc['per_cpu_second']:.0f}) "
             f"÷ one-core RS256 ceiling ({ceiling['per_cpu_second']:.0f} signatures per CPU-second) | "
             f"{r['client_credentials_per_cpu_second_vs_ceiling']:.2f} | ≥ 0.5 | "
             f"{ok(r['client_credentials_per_cpu_second_vs_ceiling'], 0.5)} |", ""]
    return rows + render_profile(d.get("profile") or {})


def render_profile(p: dict) -> list[str]:
    if p.get("skipped"):
        return [f"Profile: skipped ({p['skipped']}).", ""]
    if not p:
        return []
    rows = [f"Where a `client_credentials` token's CPU goes ({p['tool']}, {p['samples']} samples at "
            f"{p['profiled_rps']:.0f} tokens/s):", "", "| part (inclusive) | share of samples |", "|---|---|"]
    rows += [f"| {label} | {share:.0%} |" for label, share in p["inclusive_share"].items()]
    rows += ["", "| frame (own time) | share |", "|---|---|"]
    rows += [f"| `{f['frame']}` | {f['share']:.0%} |" for f in p["top_own"]]
    return rows + [""]


def render_production(p: dict) -> list[str]:
    if p.get("skipped"):
        return [f"**Production shape**: skipped ({p['skipped']}).", ""]
    ceiling = p["signing_ceiling"]["per_second"]
    cpu_ceiling = p["signing_ceiling"].get("per_cpu_second")
    t = p["targets"]
    per_cpu = f" ({cpu_ceiling:.0f} per CPU-second of the signing thread: the CPU ratios' divisor)" if cpu_ceiling else ""
    rows = [f"**Token endpoint, production shape beside embedded** (wrk {p['connections']} connections on the same "
            f"{p['cores']}-core machine; one-core RS256 ceiling {ceiling:.0f} signatures/s{per_cpu}, before and after; CPU = "
            f"serve processes + their PostgreSQL backends + the Redis server; {_when(p)}):", "",
            "| shape | `client_credentials` tokens/s | ÷ ceiling | tokens per CPU-s ÷ ceiling | CPU s (serve / PostgreSQL / Redis) "
            "| code exchanges/s | exchanges per CPU-s ÷ (ceiling ÷ 2) |",
            "|---|---|---|---|---|---|---|"]
    for shape in p["shapes"]:
        cc, ex, r = shape["client_credentials"], shape["authorization_code"], shape["ratios"]
        cpu = cc["cpu_seconds"]
        rows.append(f"| {shape['shape']} | {cc['rps']:,.0f} | {r['client_credentials_vs_ceiling']:.2f} | "
                    f"{r['client_credentials_per_cpu_vs_ceiling']:.2f} | {cpu['serve']} / {cpu['postgres']} / {cpu['redis']} | "
                    f"{ex['rps']:,.0f} | {r['authorization_code_per_cpu_vs_ceiling_per_exchange']:.2f} |")
    prod = p["shapes"][0]["ratios"]
    verdicts = []
    for key, label in (("client_credentials_vs_ceiling", "tokens/s ÷ ceiling"),
                       ("client_credentials_per_cpu_vs_ceiling", "tokens per CPU-s ÷ ceiling"),
                       ("authorization_code_per_cpu_vs_ceiling_per_exchange", "exchanges per CPU-s ÷ (ceiling ÷ 2)")):
        got, want = prod[key], t[key]
        verdicts.append(f"{label} {got:.2f} (target ≥ {want}: " + ("meets" if got >= want else
                        f"**misses by {want - got:.2f}**, {100 * (want - got) / want:.0f}%") + ")")
    return rows + ["", "Production shape: " + "; ".join(verdicts) + ".", ""] + render_balance(p.get("balance") or {}) \
        + render_peers(p.get("peers") or {}) + render_profile(p.get("profile") or {}) + render_cpu_split(p.get("cpu_split") or {})


def render_peers(c: dict) -> list[str]:
    """svc-auth's production shape against node-oidc-provider, alternating rounds (bench/peers.py)."""
    if c.get("skipped"):
        return [f"node-oidc-provider comparison: skipped ({c['skipped']}).", ""]
    if not c:
        return []
    rows = [f"**Against node-oidc-provider 9** (bench/js/oidc_peer.mjs: client_secret_basic, RS256 JWT access "
            "tokens; the client in its configuration in one process, or in its own database through a PostgreSQL "
            f"adapter over `pg`; {c['rounds']} rounds of {c['seconds']:g} s each, alternating ABBA; CPU = every "
            "process of the service + its PostgreSQL backends (+ Redis for svc-auth)):", "",
            "| service | tokens/s (median round) | slowest round | tokens per CPU-second | p99 (median round) |",
            "|---|---|---|---|---|"]
    for name in c["names"]:
        shape = c["shapes"][name]
        rows.append(f"| {name} | {shape['tokens_per_second_median']:,.0f} | {shape['min_round_rps']:,.0f} | "
                    f"{shape['per_cpu_second']:,.0f} | {shape['p99_ms_median']:.1f} ms |")
    ratios = c.get("per_cpu_second_ratios") or {c["names"][1]: c["per_cpu_second_ratio"]}
    targets = c.get("targets") or {c["names"][1]: c["target"]}
    verdicts = []
    for name, got in ratios.items():
        want = targets[name]
        verdicts.append(f"svc-auth ÷ {name}, tokens per CPU-second: {got:.2f} (target ≥ {want}: "
                        + ("meets" if got >= want else f"**misses by {want - got:.2f}**") + ").")
    return rows + [""] + verdicts + [""]


def render_floor(f: dict) -> list[str]:
    """`/healthz` and a token per CPU-second, this checkout against a baseline commit (bench/floor.py)."""
    names = f["names"]
    rows = [f"**Per-request floor, this commit against {f['baseline'][:7]}** (embedded, one `serve` each, both up, "
            f"wrk {f['connections']} connections, {f['rounds']} rounds of {f['seconds']:g} s alternating ABBA; "
            f"{_when(f)}):", "",
            "| load | " + " | ".join(f"{n} per CPU-s (CPU ms each, p99)" for n in names) + " | this ÷ baseline |",
            "|---|---|---|---|"]
    for load, ratio in f["ratios"].items():
        cells = [f"{f['shapes'][n][load]['per_cpu_second']:,.0f} ({f['shapes'][n][load]['cpu_ms_per_request']:.3f}, "
                 f"{f['shapes'][n][load]['p99_ms_median']:.1f} ms)" for n in names]
        rows.append(f"| {load} | " + " | ".join(cells) + f" | {ratio:.2f} |")
    got, want = f["ratios"]["/healthz"], f["target"]["/healthz"]
    verdict = "meets" if got >= want else f"**misses by {want - got:.2f}**"
    return rows + ["", f"`/healthz` per CPU-second ÷ the baseline's: {got:.2f} (target ≥ {want}: {verdict}).", ""]


def render_balance(b: dict) -> list[str]:
    if not b:
        return []
    rows = [f"**Balance, production shape**: each serve process's share of `client_credentials` requests, "
            f"{len(b['rounds'])} rounds of wrk's {b['connections']} new keep-alive connections "
            f"({b['seconds']:g} s each):", "", "| round | requests | shares by process | smaller share | connections by process | CPU-s by process |",
            "|---|---|---|---|---|---|"]
    rows += [f"| {r['round']} | {r['requests']:,} | {' / '.join(f'{v:.3f}' for v in r['shares'].values())} | "
             f"{r['smaller_share']:.3f} | {' / '.join(str(n) for n in r.get('connections', {}).values())} | "
             f"{' / '.join(str(v) for v in r.get('cpu_seconds', {}).values())} |" for r in b["rounds"]]
    got, want = b["smallest_share"], b["target"]
    verdict = "meets" if got >= want else f"**misses by {want - got:.3f}**"
    return rows + ["", f"Smaller share in every round ≥ {want}: smallest {got:.3f} ({verdict}).", ""]


def render_cpu_split(c: dict) -> list[str]:
    if c.get("skipped"):
        return [f"CPU by library: skipped ({c['skipped']}).", ""]
    if not c:
        return []
    rows = [f"The same load's CPU by library ({c['tool']}, {c['samples']} samples; py-spy above samples wall time, "
            "so a process preempted inside `send` by the wrk thread it woke still counts there):", "",
            "| library | share of on-CPU samples |", "|---|---|"]
    return rows + [f"| {label} | {share:.0%} |" for label, share in c["shares"].items()] + [""]


def render_fhir_reads(f: dict) -> list[str]:
    """The platform FHIR API's reads per CPU-second beside `/healthz` and a token (issue 29)."""
    if f.get("skipped"):
        return [f"**FHIR reads** ({_when(f)}): skipped ({f['skipped']}).", ""]
    targets = f.get("targets", {})
    rows = [f"**FHIR reads** ({_when(f)}), wrk {f['connections']} connections, requests per CPU-second of every "
            "process doing the work (serve; in the production shape also its PostgreSQL backends and Redis):", "",
            "| shape | `/healthz` | `client_credentials` token | `GET Patient/{id}` | ÷ `/healthz` | "
            "`Observation?patient&_count=50` | ÷ `/healthz` |", "|---|---|---|---|---|---|---|"]
    for shape in f.get("shapes", ()):
        r = shape["ratios"]
        rows.append(f"| {shape['shape']} | {shape['healthz']['per_cpu_second']:,.0f} | "
                    f"{shape['client_credentials']['per_cpu_second']:,.0f} | {shape['patient_read']['per_cpu_second']:,.0f} | "
                    f"{r['patient_read_vs_healthz']:.2f} | {shape['observation_search']['per_cpu_second']:,.0f} | "
                    f"{r['observation_search_vs_healthz']:.2f} |")
    rows += ["", f"Targets: `GET Patient/{{id}}` ÷ `/healthz` ≥ {targets.get('patient_read_vs_healthz')}, "
                 f"a search page of 50 Observations ÷ `/healthz` ≥ {targets.get('observation_search_vs_healthz')}."]
    compared = f.get("against_baseline")
    if compared:
        rows += ["", f"**This commit against {compared['baseline'][:7]}** (both up, each on its own database, "
                     f"{compared['rounds']} rounds of {compared['seconds']:g} s per load alternating ABBA; per CPU-second, "
                     "CPU ms per request in brackets):", "",
                 "| shape | load | this | baseline | this ÷ baseline |", "|---|---|---|---|---|"]
        for shape in compared["shapes"]:
            this, baseline = (shape["sides"][n] for n in shape["names"])
            for load, ratio in shape["this_vs_baseline"].items():
                rows.append(f"| {shape['shape']} | {load} | {this[load]['per_cpu_second']:,.0f} "
                            f"({this[load]['svc_cpu_ms_per_request']:.3f}) | {baseline[load]['per_cpu_second']:,.0f} "
                            f"({baseline[load]['svc_cpu_ms_per_request']:.3f}) | {ratio:.2f} |")
            rows.append(f"| {shape['shape']} | reads ÷ `/healthz` | "
                        f"{this['ratios']['patient_read_vs_healthz']:.2f} / {this['ratios']['observation_search_vs_healthz']:.2f} | "
                        f"{baseline['ratios']['patient_read_vs_healthz']:.2f} / "
                        f"{baseline['ratios']['observation_search_vs_healthz']:.2f} | |")
    proxied = f.get("proxied") or {}
    if proxied.get("skipped"):
        rows += ["", f"Proxied read: skipped ({proxied['skipped']}).", ""]
    elif proxied:
        read, healthz = proxied["read"], proxied["healthz"]
        rows += ["", f"Through a FHIR clinic on the test EHR (embedded shape): `GET Patient/{{id}}` {read['rps']:,.0f}/s; "
                     f"svc-auth {read['svc_cpu_ms_per_request']:.3f} CPU ms per proxied read against "
                     f"{healthz['svc_cpu_ms_per_request']:.3f} per `/healthz`: **{proxied['svc_cpu_per_read_vs_healthz']}×** "
                     f"(target ≤ {targets.get('proxied_read_cpu_vs_healthz_cpu')}); the EHR (Medplum in Node) "
                     f"{read['ehr_cpu_ms_per_request']:.3f} CPU ms per read.", ""]
    return rows


def render(report: dict) -> str:
    m = report["machine"]
    tail = []
    if report.get("production"):
        tail += render_production(report["production"])
    if report.get("floor"):
        tail += render_floor(report["floor"])
    if report.get("fhir_reads"):
        tail += render_fhir_reads(report["fhir_reads"])
    if report.get("remote_db"):
        tail += render_remote_db(report["remote_db"])
    if report.get("outage"):
        tail += render_outage(report["outage"])
    if report.get("appointments"):
        tail += render_appointments(report["appointments"])
    if report.get("nightly_snapshot"):
        tail += render_snapshot(report["nightly_snapshot"])
    if report.get("fhir_night"):
        tail += render_fhir_night(report["fhir_night"])
    if report.get("chart_zip"):
        tail += render_chart(report["chart_zip"])
    if report.get("hl7_feed"):
        from bench.hl7_feed import render as render_hl7_feed
        tail += render_hl7_feed(report["hl7_feed"])
    if report.get("bulk_export") and "resources" in report["bulk_export"]:
        tail += render_bulk_export(report["bulk_export"])
    if report.get("disclosure_audit"):
        from bench.disclosure_audit import render as render_disclosure_audit
        tail += render_disclosure_audit(report["disclosure_audit"])
    if "http" not in report:
        return "\n".join([f"Run {report['started_at']} on {m['cpu']}, {m['cores']} cores.", ""] + tail).rstrip()
    return render_tokens(report) + "\n\n" + "\n".join(tail).rstrip()


def render_tokens(report: dict) -> str:
    m, h = report["machine"], report["http"]
    ceiling = h["signing_ceiling"]
    r = h["ratios"]
    ok = lambda ratio: "meets" if ratio >= r["target"] else "**misses**"
    load = h.get("load_average", m["load_average"])
    rows = [
        f"Run {h.get('started_at', report['started_at'])} on {m['cpu']}, {m['cores']} cores (shared; load average "
        f"at start {', '.join(map(str, load))}), Python {m['python']}, {m['openssl']}, database "
        f"{h['database']}, {report['seconds']} s per measurement, `wrk` at {h['client_credentials']['connections']} "
        f"connections unless noted.",
        "",
        "| figure | result | p50 | p99 |",
        "|---|---|---|---|",
        f"| signing ceiling, RS256 {ceiling['before']['key']}, one core (mean of before "
        f"{ceiling['before']['per_second']:.0f} / after {ceiling['after']['per_second']:.0f}) | "
        f"{ceiling['per_second']:.0f} signatures/s | | |",
        f"| `client_credentials` tokens, one `serve` process ({h['client_credentials'].get('serve_cpu_cores', '?')} "
        f"cores busy, {h['client_credentials'].get('serve_cpu_ms_per_request', '?')} CPU ms per token) | "
        f"{h['client_credentials']['rps']:.0f} /s | "
        f"{h['client_credentials']['p50_ms']:.2f} ms | {h['client_credentials']['p99_ms']:.2f} ms |",
        f"| authorization-code exchanges ({r['signatures_per_exchange']} signatures each; "
        f"{h['authorization_code'].get('serve_cpu_cores', '?')} cores busy) | "
        f"{h['authorization_code']['rps']:.0f} /s | {h['authorization_code']['p50_ms']:.2f} ms | "
        f"{h['authorization_code']['p99_ms']:.2f} ms |",
        f"| userinfo | {h['userinfo']['rps']:.0f} req/s | {h['userinfo']['p50_ms']:.2f} ms | "
        f"{h['userinfo']['p99_ms']:.2f} ms |",
        f"| introspection | {h['introspection']['rps']:.0f} req/s | {h['introspection']['p50_ms']:.2f} ms | "
        f"{h['introspection']['p99_ms']:.2f} ms |",
        f"| `/healthz` (framework floor, no DB, no signing) | {h['healthz']['rps']:.0f} req/s | "
        f"{h['healthz']['p50_ms']:.2f} ms | {h['healthz']['p99_ms']:.2f} ms |",
    ]
    cap = report.get("load_generator_capacity")
    if cap:
        rows.append(f"| load generator ceiling (`wrk` against nginx's fixed response) | {cap['rps']:.0f} req/s | "
                    f"{cap['p50_ms']:.2f} ms | {cap['p99_ms']:.2f} ms |")
    rows += [
        "",
        "| ratio | measured | target | |",
        "|---|---|---|---|",
        f"| client_credentials tokens/s ÷ signing ceiling | {r['client_credentials_vs_ceiling']:.2f} | "
        f"≥ {r['target']} | {ok(r['client_credentials_vs_ceiling'])} |",
        f"| code exchanges/s ÷ (ceiling ÷ {r['signatures_per_exchange']}) | "
        f"{r['authorization_code_vs_ceiling_per_exchange']:.2f} | ≥ {r['target']} | "
        f"{ok(r['authorization_code_vs_ceiling_per_exchange'])} |",
        "",
        "`client_credentials` token endpoint by concurrent connections:",
        "",
        "| connections | tokens/s | p50 | p99 | errors |",
        "|---|---|---|---|---|",
    ]
    for run in h["client_credentials_sweep"]:
        rows.append(f"| {run['connections']} | {run['rps']:.0f} | {run['p50_ms']:.2f} ms | {run['p99_ms']:.2f} ms | "
                    f"{run['errors'] or 'none'} |")
    return "\n".join(rows)


def update_benchmarks_md(path: Path, report: dict) -> None:
    text = path.read_text() if path.exists() else f"# Benchmarks\n\n{BEGIN}\n{END}\n"
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    path.write_text(f"{head}{BEGIN}\n{render(report)}\n{END}{tail}")
