"""Writes the latest run's figures into BENCHMARKS.md between the generated-section markers."""
from __future__ import annotations

from pathlib import Path

BEGIN, END = "<!-- bench:latest:begin -->", "<!-- bench:latest:end -->"


def render(report: dict) -> str:
    m, h = report["machine"], report["http"]
    ceiling = h["signing_ceiling"]
    r = h["ratios"]
    ok = lambda ratio: "meets" if ratio >= r["target"] else "**misses**"
    rows = [
        f"Run {report['started_at']} on {m['cpu']}, {m['cores']} cores (shared; load average at start "
        f"{', '.join(map(str, m['load_average']))}), Python {m['python']}, {m['openssl']}, database "
        f"{h['database']}, {report['seconds']} s per measurement, `wrk` at {h['client_credentials']['connections']} "
        f"connections unless noted.",
        "",
        "| figure | result | p50 | p99 |",
        "|---|---|---|---|",
        f"| signing ceiling, RS256 {ceiling['before']['key']}, one core (mean of before "
        f"{ceiling['before']['per_second']:.0f} / after {ceiling['after']['per_second']:.0f}) | "
        f"{ceiling['per_second']:.0f} signatures/s | | |",
        f"| `client_credentials` tokens, one `serve` process | {h['client_credentials']['rps']:.0f} /s | "
        f"{h['client_credentials']['p50_ms']:.2f} ms | {h['client_credentials']['p99_ms']:.2f} ms |",
        f"| authorization-code exchanges ({r['signatures_per_exchange']} signatures each) | "
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
